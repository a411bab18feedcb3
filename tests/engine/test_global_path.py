"""The exact global path (``cockpit_lite/engine/global_path.py``) in chunks of samples, both ways
(vectorised and looped), for every transform: against statistics of the individual gradients
computed by autograd on the individual losses of one forward pass, and ``numpy.histogram``."""

import numpy as np
import pytest
import torch
from torch import nn

import problems

from cockpit_lite import transforms
from cockpit_lite.engine import Engine, global_path
from cockpit_lite.info import StepInfo
from engine.test_rules import engine_individual_gradients, individual_reference

B, BINS, RANGE = 5, 8, (-3.0, 3.0)
DIRECTION = 0.3  # the direction of BatchDotDirection: a constant per element, its index times this


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    return model, torch.randn(B, 3, dtype=torch.float64)


def direction(per_sample):
    return DIRECTION * torch.arange(per_sample.param.numel(), dtype=torch.float64)


TRANSFORMS = [
    transforms.BatchL2(),
    transforms.BatchDotGrad(),
    transforms.SumGradSquared(),
    transforms.BatchDotDirection("direction", direction),
    transforms.GradHistogram1d(BINS, RANGE),
    transforms.GradHistogram2d((BINS, 4), (RANGE, (-1.0, 1.0))),
]


def engine_values(model, x, choice, chunk_elements, monkeypatch):
    """Every transform of every parameter, all parameters on the global path (no model)."""
    monkeypatch.setattr(global_path, "CHUNK_ELEMENTS", chunk_elements)
    params = list(model.parameters())
    engine = Engine(None, params, [str(i) for i in range(len(params))])
    engine._global_mode.choice = choice
    individual = (model(x) ** 2).sum(1)
    loss = individual.sum()
    info = StepInfo({"loss": loss, "individual_losses": individual}, 0, model=None)
    engine.begin(TRANSFORMS, info, None, [None] * len(params), ["Test"])
    loss.backward()
    results, batch_size, flags = engine.finish()
    assert not flags and batch_size == B
    return [results[i] for i in range(len(params))]


def reference(model, x):
    """Per parameter, ``g̃_n = B ∇ℓ_n`` (``[B, *shape]``) by autograd, one sample at a time."""
    individual = (model(x) ** 2).sum(1)
    return [
        B * torch.stack([torch.autograd.grad(individual[n], p, retain_graph=True)[0] for n in range(B)])
        for p in model.parameters()
    ]


@pytest.mark.parametrize("choice", [None, "vmap", "loop"])  # None: the first step times both
@pytest.mark.parametrize("chunk_elements", [1, 60, 1 << 22], ids=["one_sample_per_chunk", "uneven_chunks", "one_chunk"])
def test_every_transform_in_chunks_of_samples(choice, chunk_elements, monkeypatch):
    model, x = model_and_data()
    got = engine_values(model, x, choice, chunk_elements, monkeypatch)
    for values, g, p in zip(got, reference(model, x), model.parameters()):
        flat = g.reshape(B, -1)
        gradient = flat.mean(0)
        torch.testing.assert_close(values["batch_l2"], (flat**2).sum(1))
        torch.testing.assert_close(values["batch_dot_grad"], flat @ gradient)
        torch.testing.assert_close(values["sum_grad_squared"], (g**2).sum(0))
        torch.testing.assert_close(values["direction"], flat @ (DIRECTION * torch.arange(flat.shape[1], dtype=torch.float64)))
        counts, clipped, nonfinite = values[("grad_hist_1d", BINS, RANGE)]
        expected, _ = np.histogram(flat.numpy(), BINS, RANGE)
        outside = int(((flat < RANGE[0]) | (flat > RANGE[1])).sum())
        assert counts.tolist() == expected.tolist() and int(clipped) == outside and int(nonfinite) == 0
        counts, clipped, _ = values[("grad_hist_2d", (BINS, 4), (RANGE, (-1.0, 1.0)))]
        thetas = p.detach().reshape(1, -1).expand(B, -1)
        expected, _, _ = np.histogram2d(flat.numpy().ravel(), thetas.numpy().ravel(), (BINS, 4), (RANGE, (-1.0, 1.0)))
        inside = (flat >= RANGE[0]) & (flat <= RANGE[1]) & (thetas >= -1) & (thetas <= 1)
        assert counts.tolist() == expected.astype(int).tolist() and int(clipped) == int((~inside).sum())


def test_the_first_step_keeps_the_faster_way(monkeypatch):
    """``Mode`` times both ways on the first samples once and keeps its choice."""
    model, x = model_and_data()
    mode = global_path.Mode()
    individual = (model(x) ** 2).sum(1)
    chunks = list(global_path.individual_gradients(individual, list(model.parameters()), mode))
    assert mode.choice in ("vmap", "loop")
    assert [c.start for c, _ in chunks][:2] == [0, global_path.Mode.CALIBRATION_SAMPLES]
    stacked = [torch.cat([grads[i] for _, grads in chunks]) for i in range(4)]
    for got, expected in zip(stacked, reference(model, x)):
        torch.testing.assert_close(B * got, expected)


def test_a_parameter_the_loss_does_not_use_gets_zeros():
    model, x = model_and_data()
    unused = nn.Parameter(torch.ones(3, dtype=torch.float64))
    individual = (model(x) ** 2).sum(1)
    for choice in (None, "vmap", "loop"):
        mode = global_path.Mode()
        mode.choice = choice
        for samples, (grads,) in global_path.individual_gradients(individual, [unused], mode):
            assert torch.equal(grads, torch.zeros(samples.stop - samples.start, 3, dtype=torch.float64))


@pytest.mark.parametrize("mode", [None, "vmap"], ids=["no_mode", "vmap"])
def test_the_vectorised_way_runs_without_falling_back_to_the_loop(mode, monkeypatch):
    """Without a ``Mode`` (or once it chose ``"vmap"``) every chunk is one batched backward
    pass; the loop (the fallback for operations vmap cannot batch) is never needed here,
    unused parameters included."""
    def no_loop(*args):
        raise AssertionError("fell back to the loop")

    monkeypatch.setattr(global_path, "_loop", no_loop)
    model, x = model_and_data()
    unused = nn.Parameter(torch.ones(3, dtype=torch.float64))
    individual = (model(x) ** 2).sum(1)
    chosen = None
    if mode is not None:
        chosen = global_path.Mode()
        chosen.choice = mode
    chunks = list(global_path.individual_gradients(individual, [*model.parameters(), unused], chosen))
    assert [(c.start, c.stop) for c, _ in chunks] == [(0, B)]
    for got, expected in zip(chunks[0][1], reference(model, x)):
        torch.testing.assert_close(B * got, expected)
    assert torch.equal(chunks[0][1][-1], torch.zeros(B, 3, dtype=torch.float64))


def test_a_parameter_the_loss_does_not_use_takes_the_global_path_with_zeros(monkeypatch):
    """Through the engine (a Cockpit given parameters, one of them unused): all-zero statistics."""
    model, x = model_and_data()
    unused = nn.Parameter(torch.ones(3, dtype=torch.float64))
    params = [*model.parameters(), unused]
    engine = Engine(None, params, [str(i) for i in range(len(params))])
    individual = (model(x) ** 2).sum(1)
    loss = individual.sum()
    engine.begin(TRANSFORMS[:3], StepInfo({"loss": loss, "individual_losses": individual}, 0, model=None),
                 None, [None] * len(params), ["Test"])
    loss.backward()
    results, _, flags = engine.finish()
    assert not flags
    assert [float(v.abs().sum()) for v in results[len(params) - 1].values()] == [0.0, 0.0, 0.0]
    assert float(results[0]["batch_l2"].sum()) > 0


class WithSpare(nn.Module):
    """A model with its own code around its layers and a parameter of its own it does not use."""

    def __init__(self):
        super().__init__()
        self.body, self.spare = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), nn.Parameter(torch.ones(3))

    def forward(self, x):
        return 2 * self.body(x)


def test_an_unused_parameter_of_the_model_itself_gets_zeros():
    torch.manual_seed(0)
    model = WithSpare().double()
    x = torch.randn(B, 3, dtype=torch.float64)
    got = engine_individual_gradients(model, x)
    for values, expected in zip(got, individual_reference(model, x)):
        torch.testing.assert_close(values, expected)
    assert torch.equal(got[0], torch.zeros(B, 3, dtype=torch.float64))


class CheckpointedDropout(nn.Module):
    """A dropout recomputed in every backward pass from the random state of that moment
    (``torch.utils.checkpoint`` without ``preserve_rng_state``)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Dropout(0.5))

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False, preserve_rng_state=False)


@pytest.mark.parametrize("device", problems.CPU_AND_CUDA)
@pytest.mark.parametrize("choice", [None, "vmap", "loop"], ids=["no_mode", "vmap", "loop"])
def test_backward_passes_that_recompute_a_dropout_leave_the_random_state_alone(choice, device):
    """The recomputation draws from a forked random state (CPU and the parameters' GPU)."""
    torch.manual_seed(0)
    model = CheckpointedDropout().double().to(device)
    individual = (model(torch.randn(B, 3, dtype=torch.float64, device=device)) ** 2).sum(1)
    mode = None
    if choice is not None:
        mode = global_path.Mode()
        mode.choice = choice
    states = problems.random_states(device)
    chunks = list(global_path.individual_gradients(individual, list(model.parameters()), mode))
    assert chunks[-1][0].stop == B
    assert all(torch.equal(a, b) for a, b in zip(states, problems.random_states(device)))
