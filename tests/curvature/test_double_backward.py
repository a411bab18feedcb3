"""A layer without a second derivative (nn.Hardsigmoid in torch 2.13): HessMaxEV and
Hutchinson's estimator name it and the fix; the fix gives the eigvalsh of the autograd Hessian;
the search for the layer leaves training bit-identical (random state, modes, buffers)."""

import warnings

import pytest
import torch
from torch import nn

import problems

from cockpit_lite import Cockpit
from cockpit_lite.curvature import double_backward
from cockpit_lite.quantities import HessMaxEV, HessTrace
from cockpit_lite.utils.configuration import configuration


class _Gate(nn.Module):
    """A squeeze-excitation-like gate, as in MobileNetV3: ``x · gate(fc(x))``."""

    def __init__(self, gate):
        super().__init__()
        self.fc, self.gate = nn.Linear(4, 4), gate

    def forward(self, x):
        return x * self.gate(self.fc(x))


class _Relu6Gate(nn.Module):
    """``relu6(x + 3) / 6``: hardsigmoid, written with an operator PyTorch differentiates twice."""

    def forward(self, x):
        return nn.functional.relu6(x + 3) / 6


class _FunctionalGate(nn.Module):
    """The same gate by a function call inside a module with children."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return x * nn.functional.hardsigmoid(self.fc(x))


def _model(gate):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Hardswish(), gate, nn.Linear(4, 2)).double()


def _batch():
    g = torch.Generator().manual_seed(1)
    return 3 * torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (6,), generator=g)


def _step(model, quantity):
    x, y = _batch()
    cp = Cockpit(model, [quantity], diagnose=False)
    loss = nn.functional.cross_entropy(model(x), y)
    with pytest.warns(UserWarning, match="failed at step 0"):
        with cp(0, info={"loss": loss}):
            loss.backward(create_graph=cp.create_graph(0))
    return cp.get_output()[0]


@pytest.mark.parametrize("quantity", [HessMaxEV(), HessTrace(curvature="hutchinson", probes=2)], ids=["HessMaxEV", "HessTrace"])
def test_the_layer_and_the_fix_are_named(quantity):
    """The flag names the Hardsigmoid inside the gate (module name and class), not the
    Hardswish (which has a second derivative), and the replacement."""
    entry = _step(_model(_Gate(nn.Hardsigmoid())), quantity)
    value = entry[quantity.name]
    assert torch.isnan(torch.tensor(value)).all()
    (flag,) = [f for f in entry["flags"] if f.startswith(quantity.name)]
    assert "the layer 2.gate (Hardsigmoid) has no second derivative" in flag
    assert "Fix: replace it by a module computing torch.nn.functional.relu6(x + 3) / 6" in flag
    assert "Hardswish)" not in flag and "aten::hardsigmoid_backward" in flag


def test_a_function_call_is_named_by_its_operator():
    entry = _step(_model(_FunctionalGate()), HessMaxEV())
    (flag,) = entry["flags"]
    assert "aten::hardsigmoid) that no leaf module runs on its own" in flag and "relu6(x + 3) / 6" in flag


def test_the_fix_gives_the_hessian_of_the_same_function():
    """The replaced gate computes the same outputs; HessMaxEV then matches eigvalsh of the
    float64 autograd Hessian (the Hessian of the same function: hardsigmoid's second
    derivative is zero wherever it exists, as relu6's)."""
    original, fixed = _model(_Gate(nn.Hardsigmoid())), _model(_Gate(_Relu6Gate()))
    x, y = _batch()
    torch.testing.assert_close(fixed(x), original(x), rtol=0, atol=1e-15)
    cp = Cockpit(fixed, [HessMaxEV(rtol=1e-10)], diagnose=False)
    loss = nn.functional.cross_entropy(fixed(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward(create_graph=cp.create_graph(0))
    hessian = problems.hessian_of(fixed, lambda forward: nn.functional.cross_entropy(forward(x), y))
    assert cp.get_output()[0]["HessMaxEV"] == pytest.approx(float(torch.linalg.eigvalsh(hessian).max()), rel=1e-8)


def test_other_errors_are_not_explained():
    assert double_backward.explain(RuntimeError("out of memory"), None, None) is None
    text = double_backward.explain(RuntimeError("derivative for aten::foo_backward is not implemented"), None, None)
    assert "aten::foo" in text and "Fix: replace it by layers whose backward PyTorch can differentiate" in text


def _probed_model(device):
    """A BatchNorm and a Dropout in training mode beside the gate: leaves that update buffers
    and draw random numbers when the search runs them."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4), _Gate(nn.Hardsigmoid()), nn.Dropout(0.3), nn.Linear(4, 2)
    ).double().to(device)


@pytest.mark.parametrize("device", problems.CPU_AND_CUDA)
def test_probing_leaves_the_model_and_the_random_state_alone(device):
    """The probes run every leaf in its own mode (the BatchNorm and the Dropout in training
    mode), on copies, under a forked random state (CPU and the model's GPU)."""
    model = _probed_model(device)
    x, y = (t.to(device) for t in _batch())
    loss = nn.functional.cross_entropy(model(x), y)
    before = [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]
    states = problems.random_states(device)
    error = RuntimeError("derivative for aten::hardsigmoid_backward is not implemented")
    text = double_backward.explain(error, model, loss)
    assert "the layer 2.gate (Hardsigmoid)" in text
    assert all(torch.equal(a, b) for a, b in zip(states, problems.random_states(device)))
    assert all(torch.equal(a, b) for a, b in zip(before, [*model.parameters(), *model.buffers()]))
    assert all(p.grad is None for p in model.parameters())
    assert all(m.training for m in model.modules())
    assert double_backward.explain(error, model, loss) == text  # the probes' draws are seeded


def _mobile_block():
    """Conv, Hardswish, squeeze-excitation with a Hardsigmoid gate, Dropout, read-out (MobileNetV3-like)."""

    class SqueezeExcite(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.reduce, self.expand = nn.Conv2d(channels, 2, 1), nn.Conv2d(2, channels, 1)
            self.act, self.gate = nn.ReLU(), nn.Hardsigmoid()

        def forward(self, x):
            scale = x.mean((2, 3), keepdim=True)
            return x * self.gate(self.expand(self.act(self.reduce(scale))))

    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.Hardswish(), SqueezeExcite(4), nn.Flatten(),
        nn.Dropout(0.3), nn.Linear(4 * 5 * 5, 3),
    )


def _train(optimizer, level, steps=3):
    """Parameters after ``steps`` steps, and the losses, with a Cockpit at ``level`` (None: none)."""
    torch.manual_seed(0)
    model = _mobile_block()
    cp = Cockpit(model, quantities=configuration(level), diagnose=False) if level else None
    opt = optimizer(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        x, y = torch.randn(8, 1, 5, 5, generator=data), torch.randint(0, 3, (8,), generator=data)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        losses.append(loss.item())
        if cp is None:
            loss.backward()
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # HessTrace fails on the Hardsigmoid: flagged
                with cp(step, info={"loss": loss, "optimizer": opt}):
                    loss.backward(create_graph=cp.create_graph(step))
        opt.step()
    return [p.detach().clone() for p in model.parameters()], losses, cp


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam], ids=["SGD", "Adam"])
def test_training_through_the_search_is_bit_identical(optimizer):
    """Business (HessTrace by Hutchinson's estimator) fails at every step on the Hardsigmoid and
    searches the layer, running the Dropout in training mode: parameters and losses are bit for
    bit those of training without the Cockpit."""
    plain, plain_losses, _ = _train(optimizer, None)
    observed, losses, cp = _train(optimizer, "business")
    assert all("2.gate (Hardsigmoid)" in " ".join(cp.get_output()[step]["flags"]) for step in range(3))
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(plain, observed))
