"""``experiments.fsdp_memory`` measures every rank's peak growth, sharded plain against economy, in fresh processes."""

from experiments import fsdp_memory


def test_a_short_run_of_one_small_cell(capsys, tmp_path):
    out = tmp_path / "growth.json"
    fsdp_memory.main(["--world", "1", "--steps", "1", "--cells", "gpt_tiny:2", "--json", str(out)])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gpt_tiny, 2 | 0 |")]
    assert all(cell.startswith("+") for cell in row.split(" | ")[2:4]) and out.exists()


def test_the_ratio_is_to_the_plain_step_and_left_out_when_it_grew_nothing():
    mib = 2**20
    lines = fsdp_memory.table({"gpt4:8": {"plain": [100 * mib, 0], "economy": [150 * mib, 3 * mib]}}).splitlines()
    assert lines[2:] == ["| gpt4, 8 | 0 | +100 MiB | +150 MiB (1.50×) |", "| gpt4, 8 | 1 | +0 MiB | +3 MiB |"]
