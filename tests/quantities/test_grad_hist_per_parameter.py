"""GradHist1d/2d on layers large enough for the per-parameter path, against numpy.

The models of ``tests/problems.py`` are small: every parameter there has at most
``transforms.BATCH_ELEMENTS`` individual-gradient elements and goes through the batched
histogram of small parameters. Real layers take the per-parameter path (a convolution's
``grad_batch``; a Linear layer's pieces built from its factors, ``CHUNK_ELEMENTS`` at a
time, with the rows of switched-off ReLU units counted as zeros, never built). Here
each of those paths is compared with ``numpy.histogram(2d)`` of brute-force individual
gradients (with the edge-rounding rule of ``problems.assert_counts_match``).
"""

import numpy as np
import pytest
import torch
from torch import nn

import problems
from cockpit_lite.engine import per_sample as per_sample_module, transforms
from cockpit_lite.quantities import GradHist1d, GradHist2d
from test_grad_hist_1d import histogram
from test_grad_hist_2d import histogram2d

BATCH = 16


def conv_and_linear():
    """A convolution (9216 weights) and a Linear layer after a ReLU (288 x 600: its nonzero rows take more than one piece of CHUNK_ELEMENTS) take the per-parameter path."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 32, 6, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(32 * 3 * 3, 600), nn.ReLU(), nn.Linear(600, 10),
    )


class SequenceLinear(nn.Module):
    """A Linear layer applied to every position of ``[B, T, F]`` (its gradient sums over T)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(40, 200)
        self.head = nn.Linear(5 * 200, 10)

    def forward(self, x):
        return self.head(torch.tanh(self.inner(x)).flatten(1))


def embedding():
    """An Embedding (8000 weights; only the looked-up rows are non-zero, the rest counted as
    zeros without being built) before a Linear layer."""
    return nn.Sequential(nn.Embedding(500, 16), nn.Flatten(), nn.Linear(3 * 16, 10))


def _features(*shape):
    return lambda g, b: torch.randn(b, *shape, generator=g, dtype=torch.float64)


MODELS = {  # name: (model, inputs)
    "conv_linear": (conv_and_linear, _features(3, 6, 6)),
    "sequence_linear": (SequenceLinear, _features(5, 40)),
    "embedding": (embedding, lambda g, b: torch.randint(0, 500, (b, 3), generator=g)),
}


@pytest.fixture(params=sorted(MODELS))
def problem(request, monkeypatch):
    build, inputs = MODELS[request.param]
    targets = lambda g, b: torch.randint(0, 10, (b,), generator=g)  # noqa: E731
    monkeypatch.setitem(problems.BUILDERS, request.param, (build, nn.CrossEntropyLoss, inputs, targets))
    made = problems.make(request.param, BATCH, steps=2)
    sizes = [p.numel() * BATCH for p in made.model.parameters()]
    assert sum(s > transforms.BATCH_ELEMENTS for s in sizes) >= (2 if request.param != "embedding" else 1)
    assert max(sizes) > per_sample_module.CHUNK_ELEMENTS or request.param != "conv_linear"
    return made


@pytest.mark.parametrize("bins,range", [(None, None), (37, (-0.3, 0.2))], ids=["default", "37_bins"])
def test_1d_per_parameter_path_matches_numpy(problem, bins, range):
    """``bins=None``: the defaults, 100 bins on (-2, 2)."""
    quantity = GradHist1d(per_layer=True) if bins is None else GradHist1d(bins=bins, range=range, per_layer=True)
    bins, range = (100, (-2.0, 2.0)) if bins is None else (bins, range)
    cp, snapshots = problems.run(problem, [quantity])
    for step, snapshot in snapshots.items():
        grads = problems.individual_gradients(problem, snapshot)
        value = cp.get_output()[step]["GradHist1d"]
        every = torch.cat([g.reshape(-1) for g in grads])
        problems.assert_counts_match(value["hist"], lambda v: histogram(v, bins, range)[0], every)
        assert value["clipped"] == histogram(every, bins, range)[1] and value["nonfinite"] == 0
        np.testing.assert_allclose(value["edges"], np.linspace(*range, bins + 1))
        for layer, g in zip(cp.get_output()[step]["layers"]["GradHist1d"], grads):
            problems.assert_counts_match(layer["hist"], lambda v: histogram(v, bins, range)[0], g)
        assert (np.asarray(value["hist"]) > 0).sum() >= min(bins, 10)  # the values spread over many bins


@pytest.mark.parametrize("bins,range", [(None, None), ((7, 9), ((-0.3, 0.2), (-0.25, 0.3)))], ids=["default", "7x9"])
def test_2d_per_parameter_path_matches_numpy(problem, bins, range):
    """``bins=None``: the defaults, 40 x 50 bins on (-1, 1) x (-2, 2)."""
    quantity = GradHist2d(per_layer=True) if bins is None else GradHist2d(bins=bins, range=range, per_layer=True)
    bins, range = ((40, 50), ((-1.0, 1.0), (-2.0, 2.0))) if bins is None else (bins, range)
    cp, snapshots = problems.run(problem, [quantity])
    for step, snapshot in snapshots.items():
        grads = problems.individual_gradients(problem, snapshot)
        value = cp.get_output()[step]["GradHist2d"]
        for recorded, g, p in zip(cp.get_output()[step]["layers"]["GradHist2d"], grads, snapshot.params):
            problems.assert_counts_match(recorded["hist"], lambda v: histogram2d(v, p, bins, range), g)
        flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1)
        theta = torch.cat([p.reshape(-1) for p in snapshot.params])
        problems.assert_counts_match(value["hist"], lambda v: histogram2d(v, theta, bins, range), flat)
        for edges, b, r in zip(value["edges"], bins, range):
            np.testing.assert_allclose(edges, np.linspace(*r, b + 1))
