"""``CurvatureQuantity``: the choice of curvature, its warning and ``create_graph``, with HessTrace;
values against a brute-force float64 generalised Gauss-Newton diagonal."""

import copy
import warnings

import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit, extend
from cockpit_lite.quantities import HessTrace


def _embedding_model():
    """float32: BackPACK's Embedding rule builds its one-hot matrix in float32."""
    torch.manual_seed(0)
    return extend(nn.Sequential(nn.Embedding(7, 3), nn.Flatten(), nn.Linear(6, 4)))


def _ggn_traces(model, x, y):
    """Per parameter ``Σ_d [Jᵀ (∇²_f L) J]_dd`` by autograd (the Jacobian of the logits, the Hessian of the loss)."""
    names, params = zip(*model.named_parameters())
    sizes, shapes = [p.numel() for p in params], [p.shape for p in params]
    flat = torch.cat([p.detach().reshape(-1) for p in params])

    def logits(vector):
        tensors = {n: v.reshape(s) for n, v, s in zip(names, vector.split(sizes), shapes)}
        return torch.func.functional_call(model, tensors, (x,))

    out = logits(flat).detach()
    jac = torch.autograd.functional.jacobian(logits, flat).reshape(out.numel(), -1)
    hess = torch.autograd.functional.hessian(lambda f: nn.functional.cross_entropy(f.reshape(out.shape), y), out.reshape(-1))
    return [block.sum() for block in (jac.T @ hess @ jac).diagonal().split(sizes)]


def test_an_explicit_curvature_is_checked_for_itself():
    """BackPACK's DiagGGNExact has a rule for Embedding, its DiagHessian has none: the GGN runs."""
    model = _embedding_model()
    x, y = torch.tensor([[1, 4], [0, 6], [3, 3]]), torch.tensor([2, 0, 3])
    reference = _ggn_traces(copy.deepcopy(model).double(), x, y)
    cp = Cockpit(model, [HessTrace(curvature="diag_ggn_exact")], diagnose=False)
    loss = extend(nn.CrossEntropyLoss())(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    value = cp.get_output()[0]["HessTrace"]
    assert [float(v) for v in value] == pytest.approx([float(r) for r in reference], rel=1e-4, abs=1e-7)
    with pytest.raises(ValueError, match="Embedding"):
        HessTrace(curvature="diag_h").method(_Info(model, loss))


class _Info:
    """The two things ``method`` reads from a ``StepInfo``."""

    def __init__(self, model, loss):
        self.model, self._loss = model, loss

    def get(self, key):
        return self._loss if key == "loss" else None


def _mlp_steps(quantity, steps, params_only=False):
    torch.manual_seed(0)
    model = extend(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double())
    lossfunc = extend(nn.CrossEntropyLoss())
    cp = Cockpit(model.parameters() if params_only else model, [quantity], diagnose=False)
    for step in range(steps):
        x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
        loss = lossfunc(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward(create_graph=cp.create_graph(step))
        for p in model.parameters():
            p.grad = None
    return cp


def test_without_the_model_auto_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cp = _mlp_steps(HessTrace(probes=2), 3, params_only=True)
    assert sum("Give the Cockpit the model" in str(w.message) for w in caught) == 1
    assert all(cp.get_output()[s]["meta"]["HessTrace"]["curvature"] == "hutchinson" for s in range(3))


def test_with_the_model_auto_falls_back_without_a_warning():
    """A model not extended for BackPACK, given to the Cockpit: the estimator runs, silently."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Softplus(), nn.Linear(4, 2)).double()  # not extended
    cp = Cockpit(model, [HessTrace(probes=2)], diagnose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(2):
            loss = nn.functional.cross_entropy(model(torch.randn(5, 3, dtype=torch.float64)), torch.tensor([0, 1, 1, 0, 1]))
            with cp(step, info={"loss": loss}):
                loss.backward(create_graph=cp.create_graph(step))
            for p in model.parameters():
                p.grad = None
    assert cp.get_output()[1]["meta"]["HessTrace"]["curvature"] == "hutchinson"


def test_create_graph():
    """True exactly on due steps that (will) use the estimator; "auto" before its first
    decision assumes the estimator, afterwards repeats its latest decision."""
    assert HessTrace().create_graph(0) and HessTrace(curvature="hutchinson").create_graph(0)
    assert not HessTrace(curvature="diag_h").create_graph(0)
    assert not HessTrace(track_schedule=lambda s: s == 1, curvature="hutchinson").create_graph(0)
    quantity = HessTrace()
    cp = _mlp_steps(quantity, 1)  # an extended MLP: BackPACK's exact diagonal
    assert cp.get_output()[0]["meta"]["HessTrace"]["curvature"] == "diag_h"
    assert not quantity.create_graph(0) and not quantity.create_graph(1)
    estimated = HessTrace(curvature="hutchinson", probes=2)
    _mlp_steps(estimated, 1)
    assert estimated.create_graph(1)


def test_the_estimator_defaults_are_16_probes_and_seed_0(capsys):
    """The documented defaults (silent, 16 probes, the Cockpit's generator seeded with 0): the
    record says 16 probes, and the values are those of the explicit settings."""
    default = _mlp_steps(HessTrace(curvature="hutchinson"), 2).get_output()
    explicit = _mlp_steps(HessTrace(curvature="hutchinson", probes=16, seed=0), 2).get_output()
    other_seed = _mlp_steps(HessTrace(curvature="hutchinson", probes=16, seed=1), 2).get_output()
    assert capsys.readouterr().out == ""
    for step in range(2):
        assert default[step]["meta"]["HessTrace"]["probes"] == 16
        assert default[step]["HessTrace"] == explicit[step]["HessTrace"] != other_seed[step]["HessTrace"]


def test_verbose_prints_each_value(capsys):
    _mlp_steps(HessTrace(curvature="hutchinson", probes=2, verbose=True), 1)
    assert "HessTrace" in capsys.readouterr().out


@pytest.mark.parametrize("probes", [0, -3, 1.5])
def test_probes_must_be_a_positive_integer(probes):
    with pytest.raises(ValueError, match="probes must be a positive integer"):
        HessTrace(probes=probes)


def test_a_single_probe_is_allowed():
    cp = _mlp_steps(HessTrace(curvature="hutchinson", probes=1), 1)
    assert cp.get_output()[0]["meta"]["HessTrace"]["probes"] == 1
