"""LR range test: exponential sweep on a copy, stop at divergence, min/10 suggestion, CSV, torch-free gauge."""

import math
import subprocess
import sys

import pytest
import torch
from check_cases import CASES, digits
from matplotlib.figure import Figure

from cockpit_lite import checks
from instruments.gauges import lr_range as gauge


def _sweep(steps=60):
    case = CASES["digits_mlp"]()
    (x, y), _ = digits()
    batches = [(x[i:i + 64], y[i:i + 64]) for i in range(0, 640, 64)]
    return case, checks.lr_range_test(case.model, case.loss_fn, batches, start=1e-4, end=100.0, steps=steps)


def test_sweep_is_exponential_stops_at_divergence_and_suggests_min_over_10():
    _, result = _sweep()
    ratios = [b / a for a, b in zip(result.lr, result.lr[1:])]
    assert max(ratios) - min(ratios) < 1e-9 and math.isclose(ratios[0], (1e6) ** (1 / 59))
    assert result.diverged and len(result.lr) < 60
    at = min(range(len(result.lr)), key=lambda i: result.smoothed_loss[i])
    assert result.min_lr == result.lr[at] and math.isclose(result.suggested_lr, result.min_lr / 10)
    assert "min/10" in str(result)


def test_csv_round_trip_and_gauge_png(tmp_path):
    _, result = _sweep()
    record = gauge.read_csv(result.to_csv(tmp_path / "lr.csv"))
    assert record["lr"] == result.lr and record["smoothed_loss"] == result.smoothed_loss
    assert record["suggested_lr"] == result.suggested_lr and record["diverged"] is True
    for source in (record, result, str(tmp_path / "lr.csv")):
        fig = Figure()
        ax = fig.add_subplot()
        gauge.gauge(source, ax)
        assert "suggested lr" in ax.get_title() and ax.get_xscale() == "log"
    fig.savefig(tmp_path / "lr.png")
    assert (tmp_path / "lr.png").stat().st_size > 1000


def test_no_decrease_gives_no_suggestion():
    def flat_loss(output, target):
        return output.sum() * 0 + 1.0  # nothing the learning rate can change

    result = checks.lr_range_test(torch.nn.Linear(4, 2), flat_loss, (torch.randn(16, 4), torch.zeros(16)), steps=5)
    assert result.suggested_lr is None and "never fell" in str(result)


def test_the_shortest_sweep_is_its_two_ends():
    """steps=2, the fewest allowed: the rates are start and end; steps=1 is refused."""
    model, loss_fn, batch = torch.nn.Linear(4, 2), torch.nn.MSELoss(), (torch.randn(16, 4), torch.zeros(16, 2))
    result = checks.lr_range_test(model, loss_fn, batch, start=1e-3, end=1e-1, steps=2)
    assert len(result.lr) == 2 and math.isclose(result.lr[0], 1e-3) and math.isclose(result.lr[1], 1e-1)
    with pytest.raises(ValueError, match="steps >= 2"):
        checks.lr_range_test(model, loss_fn, batch, start=1e-3, end=1e-1, steps=1)


def test_a_sweep_that_did_not_diverge_is_written_without_saying_so():
    result = checks.LRRangeResult([0.01, 0.1, 1.0], [2.0, 1.0, 1.5], [2.0, 1.4, 1.45], 0.01, 0.1, False,
                                  rule="min/10", notes=["raise end"])
    assert str(result) == "LR range test: suggested lr 0.01 (min/10); smoothed loss minimal at 0.1, 3 steps; raise end"
    result.diverged = True
    assert str(result) == ("LR range test: suggested lr 0.01 (min/10); smoothed loss minimal at 0.1, 3 steps, "
                           "stopped at divergence; raise end")


def test_gauge_module_does_not_import_torch():
    code = "import sys, instruments.gauges.lr_range; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
