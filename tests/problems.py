"""Test problems and brute-force float64 references, shared by all tests.

A ``Problem`` is a small float64 model, a loss with ``reduction`` "mean" or "sum",
and a few batches. ``run`` trains it for some SGD steps with a Cockpit and keeps
a snapshot (parameters before the step, batch) of every step, so that references
can be computed afterwards, at the same point, by brute force:

- individual gradients by a loop of ``torch.autograd.grad`` over the samples' terms
  ``c_n`` of the reduced loss of *one* forward pass of the whole batch (``g̃_n = B ∇c_n``;
  with BatchNorm in training mode the path through the batch statistics is included,
  and dropout masks are replayed from the random state the training step started with);
- the Hessian by ``torch.autograd.functional.hessian``, its top eigenvalue by
  ``torch.linalg.eigvalsh``.
"""

import contextlib
import math
import copy
import os
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import models
from cockpit_lite import Cockpit, extend

NAMES = ("mlp", "cnn", "mse")
REDUCTIONS = ("mean", "sum")
BATCH_SIZES = (2, 5)
DEVICE = torch.device(os.environ.get("COCKPIT_LITE_TEST_DEVICE", "cpu"))
"""Where the problems' models, batches and brute-force references live: the CPU unless the
environment variable ``COCKPIT_LITE_TEST_DEVICE`` names another device (``cuda``), so that the
tests built on these problems run there unchanged (``experiments/gpu_check.py`` does this)."""


def _mlp():
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def _cnn():
    return nn.Sequential(
        nn.Conv2d(1, 2, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2, 3, kernel_size=2),
        nn.Sigmoid(),
        nn.Flatten(),
        nn.Linear(3 * 2 * 2, 3),
    )


def _regression():
    return nn.Sequential(nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 2))


def _inputs(shape):
    return lambda g, b: torch.randn(b, *shape, generator=g, dtype=torch.float64)


BUILDERS = {
    # name: (model, loss class, input maker, target maker)
    "mlp": (_mlp, nn.CrossEntropyLoss, _inputs((6,)), lambda g, b: torch.randint(0, 3, (b,), generator=g)),
    "cnn": (_cnn, nn.CrossEntropyLoss, _inputs((1, 6, 6)), lambda g, b: torch.randint(0, 3, (b,), generator=g)),
    "mse": (_regression, nn.MSELoss, _inputs((4,)), lambda g, b: torch.randn(b, 2, generator=g, dtype=torch.float64)),
    **models.REALISTIC,
}


@dataclass
class Problem:
    name: str
    reduction: str
    batch_size: int
    model: nn.Module
    lossfunc: nn.Module
    batches: list

    def fresh_model(self, params, state=None):
        """A non-extended copy of the model holding copies of ``params`` (and buffers ``state``)."""
        model = BUILDERS[self.name][0]().double().to(DEVICE).train(self.model.training)
        if state is not None:
            model.load_state_dict(state)
        with torch.no_grad():
            for p, value in zip(model.parameters(), params):
                p.copy_(value)
        return model

    def loss_of(self, model, x, y, reduction=None):
        return BUILDERS[self.name][1](reduction=reduction or self.reduction)(model(x), y)

    def contributions(self, model, x, y):
        """``c_n``: each sample's term of the reduced loss, from one forward pass (with graph)."""
        elements = self.loss_of(model, x, y, reduction="none")
        per_sample = elements.reshape(x.shape[0], -1).sum(1)
        return per_sample / elements.numel() if self.reduction == "mean" else per_sample


def make(name, batch_size, reduction="mean", steps=3, seed=0):
    """Build a float64 problem with ``steps`` batches (plain problems BackPACK-extended, for curvature)."""
    build, loss_cls, inputs, target = BUILDERS[name]
    torch.manual_seed(seed)
    model, lossfunc = build().double().to(DEVICE), loss_cls(reduction=reduction)
    if name in NAMES:
        model, lossfunc = extend(model), extend(lossfunc)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [(inputs(g, batch_size).to(DEVICE), target(g, batch_size).to(DEVICE)) for _ in range(steps)]
    return Problem(name, reduction, batch_size, model, lossfunc, batches)


@dataclass
class Snapshot:
    params: list
    x: torch.Tensor
    y: torch.Tensor
    state: dict = None
    rng: torch.Tensor = None


def run(problem, quantities, lr=0.1, optimizer=None, steps=None, first_step=0, params_only=False, before_step=None,
        loss_scale=None, **cockpit_kwargs):
    """Train ``problem`` with a Cockpit; return ``(cockpit, snapshots by step)``.

    ``params_only``: give the Cockpit ``model.parameters()`` (Cockpit's style) instead of the model.
    ``before_step(params)``: called between the backward pass and ``optimizer.step()`` (clipping).
    ``loss_scale``: backward on ``loss * loss_scale`` (a micro-batch's ``loss / n``), ``info["loss"]`` the loss.
    """
    params = list(problem.model.parameters())
    opt = optimizer(params) if optimizer else torch.optim.SGD(params, lr=lr)
    tracked = params if params_only else problem.model
    cockpit_kwargs.setdefault("diagnose", False)  # exactly the quantities under test (tests/diagnosis covers the rest)
    cp = Cockpit(tracked, quantities=quantities, strict=True, **cockpit_kwargs)
    snapshots = {}
    batches = problem.batches[: steps or len(problem.batches)]
    for offset, (x, y) in enumerate(batches):
        step = first_step + offset
        state = copy.deepcopy(problem.model.state_dict())
        snapshots[step] = Snapshot([p.detach().clone() for p in params], x, y, state, rng_state())
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            (loss if loss_scale is None else loss * loss_scale).backward(create_graph=cp.create_graph(step))
        if before_step is not None:
            before_step(params)
        opt.step()
    return cp, snapshots


def rng_state():
    """The random state a step starts with: the CPU's, and ``DEVICE``'s as well when that is a GPU."""
    if DEVICE.type == "cuda":
        return torch.get_rng_state(), torch.cuda.get_rng_state(DEVICE)
    return torch.get_rng_state()


CPU_AND_CUDA = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
"""Devices for ``pytest.mark.parametrize``: the CPU always, CUDA where there is one (skipped otherwise)."""


def random_states(device):
    """The global random state of the CPU, and of the current GPU when ``device`` is ``"cuda"``."""
    return [torch.get_rng_state(), *([torch.cuda.get_rng_state()] if device == "cuda" else [])]


@contextlib.contextmanager
def replayed_rng(snapshot):
    """Run under the random state the snapshot's step started with (its dropout masks), leaving the
    caller's state as it was. ``snapshot.rng``: ``rng_state()``, a CPU state alone, or ``None``."""
    with torch.random.fork_rng(devices=[DEVICE] if DEVICE.type == "cuda" else []):
        state = snapshot.rng
        if isinstance(state, tuple):
            torch.set_rng_state(state[0])
            torch.cuda.set_rng_state(state[1], DEVICE)
        elif state is not None:
            torch.set_rng_state(state)
        yield


def _replayed_model(problem, snapshot):
    """The model as it was at the snapshot (parameters and buffers)."""
    return problem.fresh_model(snapshot.params, snapshot.state)


def individual_gradients(problem, snapshot):
    """Brute force ``g̃_n = B ∇c_n`` for every sample: list (per parameter) of ``[B, *shape]`` tensors.

    One forward pass of the whole batch (dropout masks replayed), then one
    ``torch.autograd.grad`` per sample's term ``c_n``.
    """
    model = _replayed_model(problem, snapshot)
    params = list(model.parameters())
    b = snapshot.x.shape[0]
    with replayed_rng(snapshot):
        contributions = problem.contributions(model, snapshot.x, snapshot.y)
    per_sample = []
    for n in range(b):
        grads = torch.autograd.grad(contributions[n], params, retain_graph=True, allow_unused=True)
        per_sample.append([b * (torch.zeros_like(p) if g is None else g) for g, p in zip(grads, params)])
    return [torch.stack(parts) for parts in zip(*per_sample)]


def individual_losses(problem, snapshot):
    """Brute force ``ℓ_n = B c_n`` with ``mean_n ℓ_n = L``."""
    model = _replayed_model(problem, snapshot)
    with torch.no_grad(), replayed_rng(snapshot):
        return problem.contributions(model, snapshot.x, snapshot.y) * snapshot.x.shape[0]


def gradient(problem, snapshot):
    """The mini-batch gradient, per parameter."""
    return [g.mean(0) for g in individual_gradients(problem, snapshot)]


def loss(problem, snapshot):
    model = _replayed_model(problem, snapshot)  # built first: building draws random numbers
    with torch.no_grad(), replayed_rng(snapshot):
        return problem.loss_of(model, snapshot.x, snapshot.y)


def hessian(problem, snapshot):
    """The full Hessian of the mini-batch loss w.r.t. all parameters (flattened, in order).

    By ``torch.func.functional_call`` on a fresh model holding the snapshot's state (tied
    parameters appear once; BatchNorm in training mode: the loss as computed from the
    batch statistics; dropout masks replayed).
    """
    model = _replayed_model(problem, snapshot)

    def loss_of(forward):
        with replayed_rng(snapshot):
            return problem.loss_of(forward, snapshot.x, snapshot.y)

    return hessian_of(model, loss_of)


def hessian_of(model, loss_of):
    """The full Hessian of ``loss_of(forward)`` w.r.t. ``model``'s parameters (flattened, in
    order), ``forward(x)`` being the model called with them by ``torch.func.functional_call``."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss_of_flat(vector):
        tensors = {n: v.reshape(s) for n, v, s in zip(names, vector.split(sizes), shapes)}
        return loss_of(lambda *args: torch.func.functional_call(model, tensors, args))

    return torch.autograd.functional.hessian(loss_of_flat, flat)


def layer_blocks(problem):
    """Slices of the flattened parameter vector, one per parameter tensor."""
    sizes = [p.numel() for p in problem.model.parameters()]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [slice(s, s + n) for s, n in zip(starts, sizes)]


CASES = [(name, b, red) for name in NAMES for b in BATCH_SIZES for red in REDUCTIONS]
"""(problem name, batch size, reduction): the plain models (BackPACK curvature works on them),
an even and an odd batch, both reductions."""

REALISTIC_CASES = [(name, 4, red) for name in models.REALISTIC for red in REDUCTIONS]
"""The realistic models of ``tests/models.py`` (first-order quantities), both reductions."""

FIRST_ORDER_CASES = CASES + REALISTIC_CASES


def case_id(case):
    return "-".join(str(c) for c in case)


MAX_RELATIVE_ERRORS = {}
"""Quantity name → largest relative error against brute force seen in this test session."""


def assert_close(actual, expected, rtol=1e-6, atol=1e-12, what=""):
    """Compare a recorded value (float or list) with a reference (tensor, float or list)."""
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(
        [float(e) for e in expected] if isinstance(expected, (list, tuple)) else float(expected),
        dtype=torch.float64,
    )
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if what and actual.numel():
        error = float(((actual - expected).abs() / expected.abs().clamp(min=1e-12)).max())
        name = what.split(",")[0]
        MAX_RELATIVE_ERRORS[name] = max(MAX_RELATIVE_ERRORS.get(name, 0.0), error)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def check(quantity, reference, case, steps=3, rtol=1e-6, layers=True, schedule_steps=None, **run_kwargs):
    """Run ``quantity`` on ``case`` and compare every recorded step with ``reference``.

    Args:
        quantity: a Quantity instance (tracked alone).
        reference: ``reference(problem, snapshots, step)`` returning the expected value,
            or ``(value, per-layer list)`` when ``layers`` is true.
        case: (problem name, batch size, reduction).
        schedule_steps: the steps at which a value must be recorded (default: all).

    Returns:
        The record.
    """
    problem = make(*case, steps=steps)
    cp, snapshots = run(problem, [quantity], **run_kwargs)
    record = cp.get_output()
    expected_steps = sorted(snapshots) if schedule_steps is None else sorted(schedule_steps)
    recorded = sorted(s for s, entry in record.items() if quantity.name in entry)
    assert recorded == expected_steps, f"{quantity.name} recorded at {recorded}, expected {expected_steps}"
    for step in expected_steps:
        expected = reference(problem, snapshots, step)
        entry = record[step]
        if layers:
            expected, expected_layers = expected
            assert_close(entry["layers"][quantity.name], expected_layers, rtol, what=f"{quantity.name} layers, step {step}")
        assert_close(entry[quantity.name], expected, rtol, what=f"{quantity.name}, step {step}")
    return record


def ggn(problem, snapshot):
    """The generalised Gauss-Newton matrix ``Jᵀ (∇²_f L) J`` of the mini-batch loss (flattened), ``f``
    the model's outputs (the loss module's input), with the model as it was at the snapshot
    (parameters, buffers, dropout masks replayed)."""
    model = _replayed_model(problem, snapshot)
    lossfunc = BUILDERS[problem.name][1](reduction=problem.reduction)
    return ggn_of(model, snapshot.x, lambda f: lossfunc(f, snapshot.y), replay=lambda: replayed_rng(snapshot))


def ggn_of(model, x, loss_of_outputs, replay=contextlib.nullcontext):
    """Brute force ``Jᵀ (∇²_f L) J`` (flattened, parameters in order): ``J`` the Jacobian of the
    model's outputs ``f = model(x)`` by ``torch.autograd.functional.jacobian``, ``∇²_f L`` the
    Hessian of ``loss_of_outputs(f)`` by ``torch.autograd.functional.hessian``; each forward pass
    runs under ``replay()`` (a dropout mask replayed)."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def outputs_of_flat(vector):
        tensors = {n: v.reshape(s) for n, v, s in zip(names, vector.split(sizes), shapes)}
        with replay():
            return torch.func.functional_call(model, tensors, (x,))

    outputs = outputs_of_flat(flat).detach()
    jacobian = torch.autograd.functional.jacobian(outputs_of_flat, flat).reshape(outputs.numel(), -1)
    output_hessian = torch.autograd.functional.hessian(
        lambda f: loss_of_outputs(f.reshape(outputs.shape)), outputs.reshape(-1)
    )
    return jacobian.T @ output_hessian @ jacobian


EDGE_TOLERANCE = 1e-12
"""Individual-gradient elements within this distance (relative to the largest one) of a bin
edge may land on either side: the engine and the brute force reach them by different
float64 roundings (a mathematically zero element is ±1e-18 in one and 0 in the other)."""


def assert_counts_match(actual, count, values):
    """``actual`` equals ``count(values)`` up to values within ``EDGE_TOLERANCE`` of an edge.

    Every bin must lie between the counts of the values shifted down and up by the
    tolerance (and the exact count), and the totals must agree, so only elements that
    sit on an edge can move, and only to a neighbouring bin.
    """
    import numpy as np

    eps = EDGE_TOLERANCE * float(values.abs().max()) if values.numel() else 0.0
    variants = np.stack([np.asarray(count(values + shift)) for shift in (0.0, -eps, eps)])
    actual = np.asarray(actual)
    assert actual.sum() == variants[0].sum(), f"total count {actual.sum()} != {variants[0].sum()}"
    low, high = variants.min(0), variants.max(0)
    bad = (actual < low) | (actual > high)
    assert not bad.any(), f"counts differ beyond edge rounding at bins {np.argwhere(bad).tolist()}: {actual[bad]} vs {variants[0][bad]}"


def assert_prints_only_when_verbose(quantity_class, capsys, **kwargs):
    """Three steps of the MLP problem with ``quantity_class(**kwargs)``: silent by default,
    its name printed with ``verbose=True``."""
    for verbose in (False, True):
        run(make("mlp", 4, steps=3), [quantity_class(verbose=True, **kwargs) if verbose else quantity_class(**kwargs)])
        assert (quantity_class.__name__ in capsys.readouterr().out) == verbose


def products_made(monkeypatch):
    """The steps at which the Cockpit takes Hessian-vector products from now on (recorded, not changed)."""
    import cockpit_lite.step_context
    from cockpit_lite.curvature.hvp import HessianVectorProducts

    made = []

    class Recorded(HessianVectorProducts):
        def __init__(self, loss, params, step, *rest):
            super().__init__(loss, params, step, *rest)
            made.append(step)

    monkeypatch.setattr(cockpit_lite.step_context, "HessianVectorProducts", Recorded)
    return made


def run_autocast(quantity, steps=2, batch_size=32, offset=50.0, autocast=True, trace=None, with_losses=False,
                 lr=1e-3, **cockpit_kwargs):  # quantity: one or a list
    """A float32 MLP trained under bf16 autocast (or without) on targets far from its outputs (the
    last bias's gradient is nearly the same in every sample: a GSNR of ~10⁴). Returns the record and,
    per step, the float64 individual gradients by a loop of autograd.grad over the individual losses
    of one forward pass under the same autocast. ``trace`` (a dict) gets ``"params"``, the parameters
    before each step and after the last, and ``"losses"``, each step's individual losses;
    ``with_losses``: those go to the Cockpit too, as ``info["individual_losses"]``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(DEVICE)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    cp = Cockpit(model, quantity if isinstance(quantity, list) else [quantity], strict=True, diagnose=False,
                          **cockpit_kwargs)
    g = torch.Generator().manual_seed(1)
    individual = []
    for step in range(steps):
        x = torch.randn(batch_size, 8, generator=g).to(DEVICE)
        y = offset + 0.1 * torch.randn(batch_size, 4, generator=g).to(DEVICE)
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        losses = torch.nn.functional.mse_loss(out.float(), y, reduction="none").mean(1)
        grads = [torch.autograd.grad(losses[n], params, retain_graph=True) for n in range(batch_size)]
        individual.append([torch.stack(parts).double().reshape(batch_size, -1) for parts in zip(*grads)])
        if trace is not None:
            trace.setdefault("params", []).append([p.detach().double().clone() for p in params])
            trace.setdefault("losses", []).append(losses.detach().double())
        opt.zero_grad()
        loss = losses.mean()
        info = {"loss": loss, "optimizer": opt, **({"individual_losses": losses} if with_losses else {})}
        with cp(step, info=info):
            loss.backward()
        opt.step()
    if trace is not None:
        trace["params"].append([p.detach().double().clone() for p in params])
    return cp.get_output(), individual


def assert_lost_spread_flagged(quantity, reference, offset):
    """``quantity`` on ``run_autocast``'s float32 MLP with targets ``offset`` away, where the last
    bias's individual gradients are nearly the same in every sample: its float64 brute force
    (``reference`` of the ``[B, D]`` individual gradients) is tiny but not 0, the recorded value of
    that bias is NaN with one flag naming it, and the other layers and the total keep theirs."""
    name = type(quantity).__name__
    record, individual = run_autocast(quantity, steps=1, offset=offset, autocast=False)
    entry, flat = record[0], individual[0]
    assert 0 < reference(flat[3]) < 1e-6
    layers = entry["layers"][name]
    assert math.isnan(layers[3])
    assert len(entry["flags"]) == 1
    assert entry["flags"][0].startswith(f"{name}: the ")  # names what was lost: "the spread ..."
    assert "of 2.bias is lost in the rounding" in entry["flags"][0]
    assert_close(layers[:3], [reference(f) for f in flat[:3]], rtol=1e-4)
    assert_close(entry[name], reference(torch.cat(flat, 1)), rtol=1e-4)


def assert_matches_the_same_autocast_forward(quantity_class, reference, offsets=(5.0, 50.0), rtol=2e-2):
    """A ``quantity_class()`` on ``run_autocast``'s float32 MLP under bf16 autocast, targets ``offsets`` away
    (the last bias's individual gradients nearly the same in every sample), against ``reference``
    of the ``[B, D]`` float64 individual gradients of the same autocast forward: every layer and the
    total, without a flag (``rtol``: bf16's rounding of the forward pass, 2⁻⁸, as in
    tests/quantities/test_mean_gsnr.py)."""
    name = quantity_class.__name__
    for offset in offsets:
        record, individual = run_autocast(quantity_class(), steps=2, offset=offset)
        for step, flat in enumerate(individual):
            assert "flags" not in record[step], record[step]["flags"]
            assert_close(record[step]["layers"][name], [reference(f) for f in flat], rtol=rtol, what=f"{name} bf16")
            assert_close(record[step][name], reference(torch.cat(flat, 1)), rtol=rtol, what=f"{name} bf16")


def backward(cp, step, loss, **info):
    """``loss.backward()``, inside ``cp(step, info={"loss": loss, **info})`` when there is a Cockpit (``cp``
    ``None``: the plain twin of a tracked run)."""
    if cp is None:
        loss.backward()
        return
    with cp(step, info={"loss": loss, **info}):
        loss.backward()
