"""``benchmarks.memory_peak`` measures each configuration's peak growth in a fresh process."""

from benchmarks import memory_peak


def test_a_short_run_of_one_small_cell(capsys, tmp_path):
    out = tmp_path / "peak.json"
    memory_peak.main(["--steps", "1", "--cells", "gpt:4:adamw", "--allocators", "fixed mmap threshold",
                      "--json", str(out)])
    printed = capsys.readouterr().out
    (row,) = [line for line in printed.splitlines() if line.startswith("| gpt, 4, adamw |")]
    cells = row.split(" | ")
    assert cells[1] == "fixed mmap threshold" and all(cell.startswith("+") for cell in cells[2:5])
    assert out.exists()


def test_the_ratios_are_to_the_plain_step_and_left_out_when_it_grew_nothing():
    mib = 2**20
    rows = memory_peak.table({("gpt2_small:8:sgd", "default"): {"plain": 100 * mib, "economy": 150 * mib,
                                                                 "economy, samples=8": 120 * mib},
                              ("gpt:4:sgd", "default"): {"plain": 0, "economy": 3 * mib, "economy, samples=8": 0}})
    lines = rows.splitlines()
    assert lines[2] == "| gpt2_small, 8, sgd | default | +100 MiB | +150 MiB (1.50×) | +120 MiB (1.20×) |"
    assert lines[3] == "| gpt, 4, sgd | default | +0 MiB | +3 MiB | +0 MiB |"
