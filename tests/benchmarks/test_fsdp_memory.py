"""``benchmarks.fsdp_memory`` measures every rank's peak growth, sharded plain against economy, in fresh processes."""

from benchmarks import fsdp_memory


def test_a_short_run_of_one_small_cell(capsys, tmp_path):
    out = tmp_path / "growth.json"
    fsdp_memory.main(["--world", "1", "--steps", "1", "--cells", "gpt_tiny:2", "--json", str(out)])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gpt_tiny, 2 | 0 |")]
    assert all(cell.startswith("+") for cell in row.split(" | ")[2:4]) and out.exists()


def test_the_ratio_is_to_the_plain_step_and_left_out_when_it_grew_nothing():
    mib = 2**20
    lines = fsdp_memory.table({"gpt4:8": {"plain": [100 * mib, 0], "economy": [150 * mib, 3 * mib]}}).splitlines()
    assert lines[2:] == ["| gpt4, 8 | 0 | +100 MiB | +150 MiB (1.50×) |", "| gpt4, 8 | 1 | +0 MiB | +3 MiB |"]


def test_the_floor_docs_distributed_gives_for_gpt4():
    """docs/distributed.md: 13.7M parameters, three copies of a rank's float32 shard (2 ranks) are 79 MiB."""
    builder = fsdp_memory.PROBLEMS["gpt4"][0]
    count = sum(p.numel() for p in builder().parameters())
    assert round(count / 1e6, 1) == 13.7 and round(3 * count * 4 / 2 / 2**20) == 79
