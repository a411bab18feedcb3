"""GradHist2d against numpy.histogram2d of brute-force individual gradients and parameters."""

import numpy as np
import pytest
import torch

import problems
from cockpit_lite.quantities import GradHist2d


def histogram2d(individual, param, bins, range):
    """Pairs (g̃_{n,d}, θ_d) for every sample n; out-of-range values in the edge bins."""
    x = individual.reshape(individual.shape[0], -1).numpy()
    y = np.broadcast_to(param.reshape(1, -1).numpy(), x.shape)
    counts, _, _ = np.histogram2d(
        np.clip(x, *range[0]).ravel(), np.clip(y, *range[1]).ravel(), bins=bins, range=range
    )
    return counts.astype(np.int64)


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
@pytest.mark.parametrize("bins,range", [((40, 50), ((-1.0, 1.0), (-2.0, 2.0))), ((5, 3), ((-0.1, 0.1), (-0.3, 0.2)))])
def test_matches_numpy(case, bins, range):
    problem = problems.make(*case)
    cp, snapshots = problems.run(problem, [GradHist2d(bins=bins, range=range, per_layer=True)])
    for step, snapshot in snapshots.items():
        grads = problems.individual_gradients(problem, snapshot)
        value = cp.get_output()[step]["GradHist2d"]
        layers = [histogram2d(g, p, bins, range) for g, p in zip(grads, snapshot.params)]
        flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1)
        theta = torch.cat([p.reshape(-1) for p in snapshot.params])
        problems.assert_counts_match(value["hist"], lambda v: histogram2d(v, theta, bins, range), flat)
        for recorded, g, p in zip(cp.get_output()[step]["layers"]["GradHist2d"], grads, snapshot.params):
            problems.assert_counts_match(recorded["hist"], lambda v: histogram2d(v, p, bins, range), g)
        for edges, b, r in zip(value["edges"], bins, range):
            np.testing.assert_allclose(edges, np.linspace(*r, b + 1))
        pairs = torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1)
        params = torch.cat([p.reshape(-1) for p in snapshot.params]).expand_as(pairs)
        outside = lambda v, r: (v < r[0]) | (v > r[1])  # noqa: E731
        assert value["clipped"] == int((outside(pairs, range[0]) | outside(params, range[1])).sum())


def test_defaults_schedule_and_verbose(capsys):
    """By default: every step, no per-layer histograms, nothing printed; ``per_layer`` or
    ``keep_individual`` add them."""
    from cockpit_lite import schedules

    cp, snapshots = problems.run(problems.make("mlp", 5), [GradHist2d()], steps=2)
    assert all("GradHist2d" in cp.get_output()[s] and "layers" not in cp.get_output()[s] for s in snapshots)
    assert capsys.readouterr().out == ""
    for kwargs in ({"per_layer": True}, {"keep_individual": True}):
        cp, _ = problems.run(problems.make("mlp", 5), [GradHist2d(schedules.linear(2), verbose=True, **kwargs)], steps=3)
        assert [s for s in cp.get_output() if "GradHist2d" in cp.get_output()[s]] == [0, 2]
        assert len(cp.get_output()[2]["layers"]["GradHist2d"]) == 4
        assert capsys.readouterr().out.count("GradHist2d") == 2
