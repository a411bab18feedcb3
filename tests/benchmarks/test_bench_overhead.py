"""``benchmarks.bench_overhead`` runs end to end in its quick mode (about 10 s on one thread)."""

from benchmarks import bench_overhead
from cockpit_lite import diagnosis


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


def test_budget_table(capsys, monkeypatch):
    monkeypatch.setattr(bench_overhead, "ROUNDS_S", 0.0)  # one round
    bench_overhead.main(["--budget", "--budget-lengths", "50", "--problems", "mlp"])
    printed = capsys.readouterr().out
    assert "budget=1.25" in printed and "steps recorded: bookkeeping" in printed
    rows = [line.split() for line in printed.splitlines() if line.startswith("mlp ") and "diagnose" not in line]
    assert len(rows) == 2 and "CPU time over" in printed  # (wall-clock time, CPU time)
    for row in rows:
        on, off = row[1].split("/")
        assert float(on) > 0 and float(off) > 0


def test_configs_times_only_those_and_the_plain_step(capsys):
    bench_overhead.main(["--quick", "--no-peer", "--problems", "mlp", "--configs", "lite economy (samples=8)"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("plain ", "lite", "untracked"))]
    assert [line.split("  ")[0] for line in table if "step:" not in line] == ["plain", "lite economy (samples=8)"]


def test_signals_times_each_signal_of_the_diagnosis_alone(capsys):
    bench_overhead.main(["--quick", "--no-peer", "--problems", "mlp", "--configs", "diagnosis alone", "--signals"])
    rows = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("  signal ")]
    assert rows == list(diagnosis.signals.SIGNALS)


def test_period_prints_what_the_default_adds_at_each_step_of_its_period(capsys):
    """One row per problem: the plain step, the recorded step, the step after, the untracked steps, the period."""
    bench_overhead.main(["--period", "--repeats", "2", "--problems", "mlp"])
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["problem", "plain", "recorded", "after", "untracked", "(median)", "period"]
    row = out[2].split()
    assert row[0] == "mlp" and len(row) == 6 and row[-1].endswith("x") and float(row[1]) > 0


def test_resnet18_has_torchvision_s_layout():
    """torchvision's ResNet-18 with 10 classes has 11,181,642 parameters: 20 convolutions (3 of them
    1×1 shortcuts), 20 BatchNorms, one linear layer."""
    import torch
    from torch import nn

    model = bench_overhead.resnet18()
    assert sum(p.numel() for p in model.parameters()) == 11_181_642
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 20 and sum(m.kernel_size == (1, 1) for m in convs) == 3
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 20
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_optimizer_adamw_runs_every_configuration_under_adamw(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(bench_overhead, "OPTIMIZER", bench_overhead.OPTIMIZER)  # main sets it
    bench_overhead.main(["--quick", "--no-peer", "--problems", "mlp", "--configs", "lite economy (samples=8)",
                         "--optimizer", "adamw"])
    assert "lite economy (samples=8)" in capsys.readouterr().out
    assert type(bench_overhead.Runner("mlp").opt) is torch.optim.AdamW
