"""Bin adaptation (Cockpit's ``adapt=``): new limits from brute-force maxima, used from the next histogram on."""

import numpy as np
import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import GradHist1d, GradHist2d
from cockpit_lite.quantities.bin_adaptation import GradAbsMax, ParamAbsMax


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
    """A policy due where the histogram is not still computes its maximum (and nothing is recorded)."""
    problem = problems.make("mlp", 5)
    quantity = GradHist1d(schedules.linear(2), bins=5, adapt=GradAbsMax(lambda step: step == 1))
    cp, snapshots = problems.run(problem, [quantity])
    assert [s for s in cp.get_output() if "GradHist1d" in cp.get_output()[s]] == [0, 2]
    flat = torch.cat([g.reshape(-1) for g in problems.individual_gradients(problem, snapshots[1])])
    end = float(flat.abs().max())
    np.testing.assert_allclose(cp.get_output()[2]["GradHist1d"]["edges"], np.linspace(-end, end, 6), rtol=1e-12)


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
