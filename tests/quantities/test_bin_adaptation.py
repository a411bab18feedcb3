"""Bin adaptation (Cockpit's ``adapt=``): new limits from brute-force maxima, used from the next histogram on."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import GradHist1d, GradHist2d
from cockpit_lite.quantities.bin_adaptation import GradAbsMax, NoAdaptation, ParamAbsMax


def _hist1d(values, bins, range):
    values = values.reshape(-1).numpy()
    return np.histogram(np.clip(values, *range), bins=bins, range=range)[0]


@pytest.mark.parametrize("case", [("mlp", 5, "mean"), ("cnn", 2, "sum"), ("gpt", 4, "mean")], ids=problems.case_id)
def test_grad_abs_max_1d(case):
    """The histogram adapts after steps 0 and 2 (not 1); each step's histogram uses the
    limits of the latest earlier adaptation, (1 + padding) · max_{n,d} |g̃_{n,d}|."""
    problem = problems.make(*case)
    adapt_at = lambda step: step in (0, 2)  # noqa: E731
    quantity = GradHist1d(bins=9, adapt=GradAbsMax(adapt_at, padding=0.1))
    cp, snapshots = problems.run(problem, [quantity])
    limits = (-2.0, 2.0)
    for step in sorted(snapshots):
        flat = torch.cat([g.reshape(-1) for g in problems.individual_gradients(problem, snapshots[step])])
        value = cp.get_output()[step]["GradHist1d"]
        np.testing.assert_allclose(value["edges"], np.linspace(*limits, 10), rtol=1e-12)
        problems.assert_counts_match(value["hist"], lambda v: _hist1d(v, 9, limits), flat)
        if adapt_at(step):
            end = 1.1 * float(flat.abs().max())
            limits = (-end, end)
    np.testing.assert_allclose(quantity.range, limits, rtol=1e-12)
    assert quantity.get_output() == {s: cp.get_output()[s]["GradHist1d"] for s in snapshots}


def test_adaptation_on_steps_without_histogram():
    """A policy due where the histogram is not still computes its maximum (and nothing is
    recorded), from that step's own forward pass (observed: no warning, no global path)."""
    import warnings

    problem = problems.make("mlp", 5)
    quantity = GradHist1d(schedules.linear(2), bins=5, adapt=GradAbsMax(lambda step: step == 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cp, snapshots = problems.run(problem, [quantity])
    assert not [w for w in caught if "did not see" in str(w.message)]
    assert [s for s in cp.get_output() if "GradHist1d" in cp.get_output()[s]] == [0, 2]
    flat = torch.cat([g.reshape(-1) for g in problems.individual_gradients(problem, snapshots[1])])
    end = float(flat.abs().max())
    np.testing.assert_allclose(cp.get_output()[2]["GradHist1d"]["edges"], np.linspace(-end, end, 6), rtol=1e-12)


def test_a_verbose_policy_prints_the_step_it_adapts_after(capsys):
    problems.run(problems.make("mlp", 5), [GradHist1d(bins=5, adapt=GradAbsMax(lambda step: step == 1, verbose=True))])
    assert capsys.readouterr().out.startswith("[cockpit-lite | step 1] GradAbsMax: new limits -")


def test_a_step_where_only_the_policy_is_due_forms_no_histogram():
    """Its needs are the policy's maximum alone (the histogram's counts are not formed, then dropped)."""
    from cockpit_lite.quantities.bin_adaptation import IndividualGradAbsMax

    quantity = GradHist1d(schedules.linear(2), bins=5, adapt=GradAbsMax(lambda step: step == 1))
    assert [type(t) for t in quantity.needs(1, None).transforms] == [IndividualGradAbsMax]
    assert len(quantity.needs(2, None).transforms) == 1 and quantity.needs(3, None) is None


def test_grad_and_param_abs_max_2d():
    """``GradHist2d(adapt=(GradAbsMax, ParamAbsMax))`` moves both axes; ``keep_individual`` keeps layers."""
    problem = problems.make("mlp", 5)
    quantity = GradHist2d(bins=(4, 6), adapt=(GradAbsMax(lambda s: s == 0), ParamAbsMax(lambda s: s == 0, min_size=1e-3)),
                          keep_individual=True)
    cp, snapshots = problems.run(problem, [quantity], steps=2)
    flat = torch.cat([g.reshape(-1) for g in problems.individual_gradients(problem, snapshots[0])])
    theta = max(float(p.abs().max()) for p in snapshots[0].params)
    value = cp.get_output()[1]["GradHist2d"]
    np.testing.assert_allclose(value["edges"][0], np.linspace(-float(flat.abs().max()), float(flat.abs().max()), 5), rtol=1e-12)
    np.testing.assert_allclose(value["edges"][1], np.linspace(-theta, theta, 7), rtol=1e-12)
    assert len(cp.get_output()[1]["layers"]["GradHist2d"]) == len(snapshots[0].params)


def _adapted_limits(problem, adapt_at, **run_kwargs):
    """Run ``GradHist1d(adapt=GradAbsMax(adapt_at))``; check every step's edges against the
    brute-force maximum of the latest earlier adapting step."""
    quantity = GradHist1d(bins=5, adapt=GradAbsMax(adapt_at))
    cp, snapshots = problems.run(problem, [quantity], **run_kwargs)
    limits = (-2.0, 2.0)
    for step in sorted(snapshots):
        np.testing.assert_allclose(cp.get_output()[step]["GradHist1d"]["edges"], np.linspace(*limits, 6), rtol=1e-12)
        if adapt_at(step):
            grads = problems.individual_gradients(problem, snapshots[step])
            end = max(float(g.abs().max()) for g in grads)
            limits = (-end, end)
    return snapshots


def test_grad_abs_max_without_the_model():
    """Given parameters only, every individual gradient comes from the global path."""
    _adapted_limits(problems.make("mlp", 5), lambda s: s in (0, 1), params_only=True)


def test_grad_abs_max_with_a_layer_whose_individual_gradients_are_all_zero():
    """A ReLU that never fires: the layer before it has no non-zero individual-gradient element."""
    problem = problems.make("mlp", 5)
    with torch.no_grad():
        problem.model[0].bias.fill_(-100.0)
    snapshots = _adapted_limits(problem, lambda s: s == 0, steps=2)
    grads = problems.individual_gradients(problem, snapshots[0])
    assert float(grads[0].abs().max()) == 0 and float(grads[1].abs().max()) == 0


def test_the_default_schedule_adapts_at_every_step():
    assert all(GradAbsMax(None).is_due(s) and ParamAbsMax(None).is_due(s) for s in range(4))
    _adapted_limits(problems.make("mse", 5), GradAbsMax(None).is_due, steps=3)


def test_no_adaptation_keeps_the_range():
    quantity = GradHist1d(bins=5, range=(-1, 3), adapt=NoAdaptation())
    cp, snapshots = problems.run(problems.make("mlp", 5), [quantity], steps=3)
    for step in snapshots:
        np.testing.assert_allclose(cp.get_output()[step]["GradHist1d"]["edges"], np.linspace(-1, 3, 6), rtol=1e-12)
    assert not NoAdaptation().is_due(0)


def _data(*params):
    return SimpleNamespace(params=[torch.tensor(p, dtype=torch.float64) for p in params])


@pytest.mark.parametrize("params, padding, min_size, expected", [
    ([[1e-3, -4e-4]], 0.0, None, 1e-3),  # the default smallest width (1e-6) is far below
    ([[0.1, -0.2], [0.05]], 0.1, 1.0, 1.1 * 0.5),  # m = 0.2 < min_size / 2
    ([[0.1, -0.7], [0.05]], 0.1, 1.0, 1.1 * 0.7),
    ([[3.0, -2.0]], 0.0, 1.0, 3.0),
])
def test_param_abs_max_limits(params, padding, min_size, expected):
    kwargs = {} if min_size is None else {"min_size": min_size}
    start, end = ParamAbsMax(None, padding=padding, **kwargs).limits(0, _data(*params), (-2.0, 2.0))
    assert start == pytest.approx(-expected, rel=1e-12) and end == pytest.approx(expected, rel=1e-12)


def test_a_nonfinite_maximum_keeps_the_range():
    assert ParamAbsMax(None).limits(0, _data([1.0, math.inf]), [-2.0, 3.0]) == (-2.0, 3.0)


def test_verbose_prints_the_new_limits(capsys):
    ParamAbsMax(None, padding=0.1, min_size=1.0).limits(3, _data([0.1, -0.2]), (-2.0, 2.0))
    assert capsys.readouterr().out == ""
    ParamAbsMax(None, verbose=True, padding=0.1, min_size=1.0).limits(3, _data([0.1, -0.2]), (-2.0, 2.0))
    assert capsys.readouterr().out == "[cockpit-lite | step 3] ParamAbsMax: new limits -0.55000, 0.55000\n"


def test_a_histogram_whose_gradients_are_not_finite_keeps_its_range():
    """Through the histogram: a due adaptation at a step with NaN individual gradients keeps
    the current range (and the step is flagged, not failed)."""
    import warnings

    from torch import nn

    from cockpit_lite import Cockpit

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    quantity = GradHist1d(bins=4, range=(-0.5, 1.5), adapt=GradAbsMax(lambda step: True))
    cp = Cockpit(model, [quantity], diagnose=False)
    x = torch.randn(4, 3)
    x[1, 0] = math.nan
    loss = model(x).square().mean()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cp(0, info={"loss": loss}):
            loss.backward()
    assert quantity.range == (-0.5, 1.5)
    entry = cp.get_output()[0]
    assert entry["flags"] == ["nonfinite_loss", "nonfinite_grad"] and entry["GradHist1d"]["nonfinite"] > 0
