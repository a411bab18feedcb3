"""LR range test: exponential sweep on a copy, stop at divergence, min/10 suggestion, CSV, torch-free gauge."""

import math
import subprocess
import sys

import pytest
import torch
from check_cases import CASES, digits
from matplotlib.figure import Figure

from cockpit_lite import checks
from cockpit_lite.checks import lr_range
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


def _result():
    return checks.LRRangeResult([0.01, 0.1, 1.0], [2.0, 1.0, 1.5], [2.0, 1.4, 1.45], 0.01, 0.1, True,
                                rule="min/10", notes=["raise end", "check the data"])


def test_the_result_as_plain_data_and_as_csv_text(tmp_path):
    """``to_dict`` (what the gauge draws) has every field; the CSV holds the suggestion in ``#`` lines, then a
    ``step,lr,loss,smoothed_loss`` header and one row per step (csv's line ends), floats as Python writes them."""
    result = _result()
    assert result.to_dict() == {"lr": [0.01, 0.1, 1.0], "loss": [2.0, 1.0, 1.5], "smoothed_loss": [2.0, 1.4, 1.45],
                                "suggested_lr": 0.01, "min_lr": 0.1, "diverged": True, "rule": "min/10"}
    path = result.to_csv(tmp_path / "lr.csv")
    with open(path, newline="", encoding="utf-8") as file:
        assert file.read() == ("# suggested_lr: 0.01\n# min_lr: 0.1\n# diverged: True\n# rule: min/10\n"
                               "step,lr,loss,smoothed_loss\r\n0,0.01,2.0,2.0\r\n1,0.1,1.0,1.4\r\n2,1.0,1.5,1.45\r\n")


def test_every_note_follows_the_summary():
    assert str(_result()).endswith("stopped at divergence; raise end; check the data")


def _flat_loss(output, target):
    return output.sum() * 0 + 1.0


def test_the_default_sweep_is_100_rates_from_1e_minus_7_to_10():
    result = checks.lr_range_test(torch.nn.Linear(4, 2), _flat_loss, (torch.randn(16, 4), torch.zeros(16)))
    assert len(result.lr) == 100 and math.isclose(result.lr[0], 1e-7) and math.isclose(result.lr[-1], 10.0)


@pytest.mark.parametrize("start, end", [(0.0, 1.0), (0.1, 0.1), (0.2, 0.1)])
def test_a_sweep_that_does_not_grow_from_a_positive_start_is_refused(start, end):
    with pytest.raises(ValueError, match="need 0 < start < end"):
        checks.lr_range_test(torch.nn.Linear(4, 2), _flat_loss, (torch.randn(16, 4), torch.zeros(16)), start=start,
                             end=end, steps=3)


def test_the_default_optimizer_is_sgd_with_momentum_0_9_and_a_given_one_is_used():
    """On ``loss = w²`` (one weight, float64) the recorded losses are those of a hand-written SGD with momentum
    0.9 at the swept rates; an optimizer factory given instead is what steps the copy (plain SGD here)."""
    model = torch.nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.5)
    batch = (torch.ones(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))
    square = torch.nn.MSELoss()
    for momentum, optimizer in [(0.9, None), (0.0, lambda params: torch.optim.SGD(params, lr=1.0))]:
        result = checks.lr_range_test(model, square, batch, optimizer=optimizer, start=1e-3, end=1e-1, steps=6)
        w, buffer, expected = 1.5, None, []
        for lr in result.lr:
            expected.append(w * w)
            gradient = 2 * w
            buffer = gradient if buffer is None else momentum * buffer + gradient
            w -= lr * buffer
        assert result.loss == pytest.approx(expected, rel=1e-12), momentum
    assert model.weight.item() == 1.5


def test_the_default_seed_is_0():
    """Dropout draws from the seeded, forked random state: the default is seed 0's sweep, seed 1 another."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    batch = (torch.randn(16, 4), torch.zeros(16, 1))
    losses = [checks.lr_range_test(model, torch.nn.MSELoss(), batch, steps=5, **seed).loss
              for seed in ({}, {"seed": 0}, {"seed": 1})]
    assert losses[0] == losses[1] and losses[0] != losses[2]


def _scripted_sweep(values, steps=None):
    """The sweep of a float64 model whose loss is ``values[step]`` (through its output, so that backward runs)."""
    script = iter(values)

    def loss_fn(output, target):
        return output.sum() * 0 + next(script)

    model, batch = torch.nn.Linear(2, 1).double(), (torch.randn(4, 2, dtype=torch.float64), torch.zeros(4, 1))
    return checks.lr_range_test(model, loss_fn, batch, start=1e-3, end=1e-1, steps=steps or len(values))


def test_the_smoothed_loss_is_the_bias_corrected_moving_average():
    """Losses 1, 0.5, 0.8: smoothed 1, (0.09 + 0.05) / 0.19 and (0.081 + 0.045 + 0.08) / 0.271; the sweep ran to
    its end (not diverged, said in a note) and suggests a tenth of the rate at the smoothed minimum (step 1)."""
    result = _scripted_sweep([1.0, 0.5, 0.8])
    assert result.smoothed_loss == pytest.approx([1.0, 0.14 / 0.19, 0.206 / 0.271], rel=1e-12)
    assert result.loss == [1.0, 0.5, 0.8] and result.diverged is False
    assert result.min_lr == result.lr[1] and math.isclose(result.suggested_lr, result.lr[1] / 10)
    assert result.notes == ["the loss had not diverged at the end of the sweep: raise end to see the edge"]


@pytest.mark.parametrize("losses, stop", [
    ([1.0, 0.95, 3.8, 3.9], 3),  # above 4 times the best (0.95), not at it
    ([1.0, float("nan"), 1.0], 1),  # not finite
    ([2.0, 1.7, 2.02], 2),  # fell below 0.9 of the start (1.8), then rose above the start: undone
    ([2.0, 1.8, 2.02, 1.0], None),  # fell to 0.9 of the start only
    ([2.0, 1.7, 2.0, 1.0], None),  # back at the start, not above it
    ([2.0, 1.7, 1.8, 1.0], None),  # rose, still below the start
    ([2.0, 1.9, 2.02, 1.0], None),  # rose above the start without having fallen below 0.9 of it
])
def test_the_sweep_stops_where_the_smoothed_loss_diverges(monkeypatch, losses, stop):
    """With the smoothing off (the smoothed loss is the loss): the step that diverges is the last recorded."""
    monkeypatch.setattr(lr_range, "SMOOTHING", 0.0)
    result = _scripted_sweep(losses)
    assert result.diverged is (stop is not None)
    assert len(result.lr) == (len(losses) if stop is None else stop + 1)


def test_a_fall_of_exactly_one_percent_gives_a_suggestion_and_none_at_all_gives_none(monkeypatch):
    monkeypatch.setattr(lr_range, "SMOOTHING", 0.0)
    fell = _scripted_sweep([1.0, 0.99])
    assert fell.min_lr == fell.lr[1] and math.isclose(fell.suggested_lr, fell.lr[1] / 10)
    flat = _scripted_sweep([1.0, 1.0])
    assert (flat.suggested_lr, flat.min_lr, flat.diverged) == (None, None, False)
    assert flat.loss == [1.0, 1.0] and flat.smoothed_loss == [1.0, 1.0] and len(flat.notes) == 1


def test_an_untouched_parameter_keeps_its_place_between_the_steps_that_use_it():
    """Gradients are set to None at every step: a weight that the loss skips at one step (a branch taken only
    sometimes) is not moved by the momentum at that step. ``loss = w²`` at steps 0 and 2, a constant at step 1."""
    model = torch.nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.5)
    calls = []

    def loss_fn(output, target):
        calls.append(None)
        return torch.tensor(1.0, dtype=torch.float64, requires_grad=True) if len(calls) == 2 else output.pow(2).sum()

    batch = (torch.ones(1, 1, dtype=torch.float64), None)
    result = checks.lr_range_test(model, loss_fn, batch, start=1e-3, end=1e-2, steps=3)
    w = 1.5 - result.lr[0] * 2 * 1.5  # step 0; step 1 leaves it
    assert result.loss[2] == pytest.approx(w * w, rel=1e-12)
