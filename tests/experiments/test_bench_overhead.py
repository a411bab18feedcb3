"""``experiments.bench_overhead`` runs end to end in its quick mode (about 10 s on one thread)."""

from experiments import bench_overhead


def test_quick_mlp(capsys, tmp_path):
    out = tmp_path / "overhead.json"
    bench_overhead.main(["--quick", "--no-peer", "--problems", "mlp", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "plain" in printed and "lite economy" in printed and "lite economy (recipe)" in printed
    assert out.exists()


def test_memory_is_the_child_process_own_growth():
    """A parent much larger than the child must not hide the child's growth (``ru_maxrss`` does)."""
    import torch

    ballast = torch.ones(300 * 2**20 // 4)  # 300 MiB resident in this (parent) process
    assert ballast[-1] == 1
    grown = bench_overhead.peak_memory("mlp", "lite economy")
    assert 2**20 < grown < 300 * 2**20


def test_budget_table(capsys):
    bench_overhead.main(["--budget", "--budget-steps", "60", "--problems", "mlp"])
    printed = capsys.readouterr().out
    assert "budget=1.25" in printed and "/octave" in printed
    assert any(line.split()[:2] == ["HessMaxEV", "curvature"] for line in printed.splitlines())
