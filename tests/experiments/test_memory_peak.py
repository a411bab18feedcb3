"""``experiments.memory_peak`` measures each configuration's peak growth in a fresh process."""

from experiments import memory_peak


def test_a_short_run_of_one_small_cell(capsys, tmp_path):
    out = tmp_path / "peak.json"
    memory_peak.main(["--steps", "1", "--cells", "gpt:4:adamw", "--allocators", "fixed mmap threshold",
                      "--json", str(out)])
    printed = capsys.readouterr().out
    (row,) = [line for line in printed.splitlines() if line.startswith("| gpt, 4, adamw |")]
    cells = row.split(" | ")
    assert cells[1] == "fixed mmap threshold" and cells[2].startswith("+") and cells[3].endswith("×)")
    assert out.exists()
