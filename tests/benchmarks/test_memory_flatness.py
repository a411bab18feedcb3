"""``benchmarks.memory_flatness`` measures in a fresh process and tabulates the growth."""

from benchmarks import memory_flatness


def test_a_short_run_in_a_fresh_process(capsys, tmp_path):
    out = tmp_path / "flat.json"
    memory_flatness.main(["--steps", "2", "--problems", "gpt", "--configs", "plain", "economy, samples=8",
                          "--json", str(out)])
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| gpt |")]
    assert [row.split(" | ")[1] for row in rows] == ["plain", "economy, samples=8"]
    assert "RSS step 2 / step 2" in printed
    assert out.exists()


def test_resident_is_this_process_resident_set():
    import torch

    before = memory_flatness.resident()
    ballast = torch.ones(200 * 2**20 // 4)  # 200 MiB, touched
    assert memory_flatness.resident() - before > 150 * 2**20
    assert ballast[-1] == 1
