"""The exact global path (``cockpit_lite/engine/global_path.py``) in chunks of samples, both ways
(vectorised and looped), for every transform: against statistics of the individual gradients
computed by autograd on the individual losses of one forward pass, and ``numpy.histogram``."""

import numpy as np
import pytest
import torch
from torch import nn

import problems

from cockpit_lite.engine import transforms
from cockpit_lite.engine import Engine, global_path
from cockpit_lite.info import StepInfo
from engine.test_rules import Keep, engine_individual_gradients, individual_reference

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


def _asked(monkeypatch):
    """The shapes of the parameters whose individual gradients the global path forms, call by call."""
    asked = []
    original = global_path.individual_gradients

    def spy(contributions, params, mode=None):
        asked.append([tuple(p.shape) for p in params])
        return original(contributions, params, mode)

    monkeypatch.setattr(global_path, "individual_gradients", spy)
    return asked


def test_an_unused_parameter_of_the_model_itself_gets_zeros(monkeypatch):
    """Its zeros take no backward pass per sample (through the whole graph each: an unused 512 x 512 layer
    beside an MLP's made every step 9 times as long) and no ``[B, *shape]`` tensor of zeros."""
    asked = _asked(monkeypatch)
    torch.manual_seed(0)
    model = WithSpare().double()
    x = torch.randn(B, 3, dtype=torch.float64)
    got = engine_individual_gradients(model, x)
    for values, expected in zip(got, individual_reference(model, x)):
        torch.testing.assert_close(values, expected)
    assert torch.equal(got[0], torch.zeros(B, 3, dtype=torch.float64))
    assert asked == []


def test_a_parameter_in_the_loss_but_in_no_samples_loss_gets_zeros_on_the_global_path(monkeypatch):
    """The loss reaches it (``+ 0·Σ spare``), so the global path serves it (its model runs its own code around
    its layers), but no sample's loss does: zeros, without a backward pass per sample, checked (autograd's
    gradient of it is 0 too)."""
    asked, served = _asked(monkeypatch), []
    original = global_path.serve
    monkeypatch.setattr(global_path, "serve", lambda state, info, indices, *args: (
        served.append(list(indices)), original(state, info, indices, *args))[1])
    torch.manual_seed(0)
    model = WithSpare().double()
    params = list(model.parameters())
    engine = Engine(model, params, [str(i) for i in range(len(params))])
    x = torch.randn(B, 3, dtype=torch.float64)
    individual = (model(x) ** 2).sum(1)
    loss = individual.sum() + 0.0 * model.spare.sum()
    info = StepInfo({"loss": loss, "individual_losses": individual}, 0, batch_size=engine.batch_size(), model=model)
    engine.begin([Keep()], info, info.batch_size, [None] * len(params), ["Test"])
    loss.backward()
    results, _, flags = engine.finish()
    assert flags == [] and served == [[0]] and asked == []
    assert torch.equal(results[0]["keep"], torch.zeros(B, 3, dtype=torch.float64))
    for index, expected in enumerate(individual_reference(model, x)[1:], 1):
        torch.testing.assert_close(results[index]["keep"], expected)


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


class _Checkpointed(nn.Module):
    """Linear → BatchNorm (training) → ReLU inside ``torch.utils.checkpoint``, then a head: the layers
    before the BatchNorm take the global path, and every backward pass recomputes the segment."""

    def __init__(self, reentrant):
        super().__init__()
        self.lin, self.bn, self.head, self.reentrant = nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3), reentrant

    def forward(self, x):
        segment = lambda t: torch.relu(self.bn(self.lin(t)))  # noqa: E731
        return self.head(torch.utils.checkpoint.checkpoint(segment, x, use_reentrant=self.reentrant))


def _train_checkpointed(reentrant, quantities, steps=3):
    """``(state dict, record)`` after SGD steps of ``_Checkpointed`` (float64) with a Cockpit of
    ``quantities`` (``None``: none)."""
    from cockpit_lite import Cockpit

    torch.manual_seed(0)
    model = _Checkpointed(reentrant).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, quantities, diagnose=False, strict=True) if quantities is not None else None
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=reentrant)
        y = torch.randint(0, 3, (5,), generator=g)
        opt.zero_grad()
        problems.backward(cp, step, nn.functional.cross_entropy(model(x), y))
        opt.step()
    return model.state_dict(), None if cp is None else cp.get_output()


def test_a_checkpointed_batch_norm_keeps_its_running_statistics():
    """The Cockpit's passes before the user's backward (the global path, the GGN's passes) recompute
    the checkpointed segment, whose BatchNorm updates its running statistics each time: they are put
    back, so the state after three steps is the plain run's, bit for bit (it drifted: 11 more updates
    of ``num_batches_tracked`` after 3 steps)."""
    from cockpit_lite.quantities import NormTest, TICDiag

    plain, _ = _train_checkpointed(False, None)
    watched, record = _train_checkpointed(False, [NormTest(), TICDiag()])
    assert all(torch.equal(plain[k], watched[k]) for k in plain)
    assert all(np.isfinite(record[s]["NormTest"]) and np.isfinite(record[s]["TICDiag"]) for s in range(3))


def test_a_reentrant_checkpoint_is_refused_naming_the_fix():
    """A reentrant checkpoint hides its parameters from every backward pass but the user's: the step
    is refused before the backward pass, naming ``use_reentrant=False``, which works (previously the
    values were NaN with a flag about a penalty term)."""
    from cockpit_lite.quantities import NormTest

    with pytest.raises(ValueError, match=r"use_reentrant=True.*lin\.weight.*Fix: checkpoint with use_reentrant=False"):
        _train_checkpointed(True, [NormTest()])
    _, record = _train_checkpointed(False, [NormTest()])
    assert all(np.isfinite(record[s]["NormTest"]) for s in range(3))
