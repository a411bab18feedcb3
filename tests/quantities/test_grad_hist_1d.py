"""GradHist1d against numpy.histogram of brute-force individual gradients."""

import numpy as np
import pytest
import torch

import problems
from cockpit_lite.quantities import GradHist1d


def histogram(values, bins, range):
    values = values.reshape(-1).numpy()
    counts, _ = np.histogram(np.clip(values, *range), bins=bins, range=range)
    return counts, int(((values < range[0]) | (values > range[1])).sum())


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
@pytest.mark.parametrize("bins,range", [(100, (-2.0, 2.0)), (7, (-0.05, 0.03))])
def test_matches_numpy(case, bins, range):
    problem = problems.make(*case)
    cp, snapshots = problems.run(problem, [GradHist1d(bins=bins, range=range, per_layer=True)])
    for step, snapshot in snapshots.items():
        grads = problems.individual_gradients(problem, snapshot)
        value = cp.get_output()[step]["GradHist1d"]
        counts, clipped = histogram(torch.cat([g.reshape(-1) for g in grads]), bins, range)
        problems.assert_counts_match(value["hist"], lambda v: histogram(v, bins, range)[0], torch.cat([g.reshape(-1) for g in grads]))
        assert value["clipped"] == clipped and value["nonfinite"] == 0
        np.testing.assert_allclose(value["edges"], np.linspace(*range, bins + 1))
        for layer, g in zip(cp.get_output()[step]["layers"]["GradHist1d"], grads):
            problems.assert_counts_match(layer["hist"], lambda v: histogram(v, bins, range)[0], g)


def test_defaults_schedule_and_verbose(capsys):
    """By default: every step, no per-layer histograms, nothing printed."""
    from cockpit_lite import schedules

    cp, snapshots = problems.run(problems.make("mlp", 5), [GradHist1d()], steps=3)
    assert all("GradHist1d" in cp.get_output()[s] and "layers" not in cp.get_output()[s] for s in snapshots)
    entry = cp.get_output()[0]  # (every sample's gradient: integer counts, no subsample's meta)
    assert np.issubdtype(np.asarray(entry["GradHist1d"]["hist"]).dtype, np.integer) and "meta" not in entry
    assert capsys.readouterr().out == ""
    cp, _ = problems.run(problems.make("mlp", 5), [GradHist1d(schedules.linear(2), verbose=True)], steps=3)
    assert [s for s in cp.get_output() if "GradHist1d" in cp.get_output()[s]] == [0, 2]
    assert capsys.readouterr().out.count("GradHist1d") == 2
