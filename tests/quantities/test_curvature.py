"""``CurvatureQuantity``: the choice of curvature, its warning and its Hessian-vector products, with HessTrace;
values against a brute-force float64 generalised Gauss-Newton diagonal."""

import copy
import math
import warnings

import pytest
import torch
from torch import nn

import problems
from cockpit_lite import Cockpit, extend
from cockpit_lite.quantities import HessTrace, TICDiag


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


def test_parameters_of_an_extended_model_get_the_exact_diagonal():
    """Cockpit's recipe (parameters only, model and loss extended): "auto" finds the model in the
    forward pass and takes BackPACK's exact Hessian diagonal, silently, equal to autograd's."""
    model_given = _mlp_steps(HessTrace(), 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        params_given = _mlp_steps(HessTrace(), 3, params_only=True)
    for step in range(3):
        assert params_given.get_output()[step]["meta"]["HessTrace"]["curvature"] == "diag_h"
        assert params_given.get_output()[step]["HessTrace"] == pytest.approx(model_given.get_output()[step]["HessTrace"], rel=1e-12)
    torch.manual_seed(0)  # step 0 again, against the Hessian of autograd
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    names = [n for n, _ in model.named_parameters()]

    def loss_of(flat):
        tensors = {n: v.reshape(p.shape) for n, v, p in zip(names, flat.split(sizes), params)}
        return nn.functional.cross_entropy(torch.func.functional_call(model, tensors, (x,)), y)

    hessian = torch.autograd.functional.hessian(loss_of, torch.cat([p.detach().reshape(-1) for p in params]))
    exact = [float(block.sum()) for block in hessian.diagonal().split(sizes)]
    assert params_given.get_output()[0]["HessTrace"] == pytest.approx(exact, rel=1e-10)


def test_auto_says_before_backward_where_backpack_cannot_serve_an_extended_model():
    """An extended model with a layer BackPACK has no DiagHessian rule for (LayerNorm): the
    warning names the layer, once, when the step's context is created (before backward)."""
    torch.manual_seed(0)
    model = extend(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)).double())
    lossfunc = extend(nn.CrossEntropyLoss())
    for tracked in (model, model.parameters()):
        cp = Cockpit(tracked, [HessTrace(probes=2)], diagnose=False)
        for step in range(2):
            loss = lossfunc(model(torch.randn(5, 3, dtype=torch.float64)), torch.tensor([0, 1, 1, 0, 1]))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                context = cp(step, info={"loss": loss})
            messages = [str(w.message) for w in caught if "Hutchinson" in str(w.message)]
            assert len(messages) == (1 if step == 0 else 0)
            if step == 0:
                assert "1 (LayerNorm)" in messages[0] and "cockpit_lite.extend" in messages[0]
            with context:
                loss.backward(create_graph=cp.create_graph(step))
            for p in model.parameters():
                p.grad = None
        assert cp.get_output()[1]["meta"]["HessTrace"]["curvature"] == "hutchinson"


@pytest.mark.parametrize("extended, named", [
    ("model", "the loss was not computed by an extended CrossEntropyLoss"),
    ("loss", "the layer 0 (Linear) is not BackPACK-extended"),
])
def test_auto_warns_where_only_the_model_or_only_the_loss_is_extended(extended, named):
    """Either one extended says the user meant BackPACK's exact diagonal: "auto" estimates, and its
    warning names what BackPACK lacks (the other one)."""
    torch.manual_seed(0)
    model, lossfunc = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double(), nn.CrossEntropyLoss()
    model, lossfunc = (extend(model), lossfunc) if extended == "model" else (model, extend(lossfunc))
    cp = Cockpit(model, [HessTrace(probes=2)], diagnose=False)
    loss = lossfunc(model(torch.randn(5, 3, dtype=torch.float64)), torch.tensor([0, 1, 1, 0, 1]))
    with pytest.warns(UserWarning, match="curvature='auto' uses Hutchinson's estimator") as caught:
        context = cp(0, info={"loss": loss})
    assert [str(w.message) for w in caught if named in str(w.message)]
    with context:
        loss.backward(create_graph=cp.create_graph(0))
    assert cp.get_output()[0]["meta"]["HessTrace"]["curvature"] == "hutchinson"


def test_parameters_no_module_owns_warn_and_estimate():
    """Parameters used by functional code only: no module to check, so "auto" estimates and says why."""
    torch.manual_seed(0)
    weight = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    cp = Cockpit([weight], [HessTrace(probes=2)], diagnose=False)
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0])
    loss = nn.functional.cross_entropy(nn.functional.linear(x, weight), y)
    with pytest.warns(UserWarning, match="found no module owning the tracked parameters"):
        context = cp(0, info={"loss": loss})
    with context:
        loss.backward(create_graph=cp.create_graph(0))
    assert cp.get_output()[0]["meta"]["HessTrace"]["curvature"] == "hutchinson"


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


def test_products_exactly_where_the_estimator_runs(monkeypatch):
    """Needs.hvp on due steps that use the estimator only: "auto" on an extended MLP takes
    BackPACK's exact diagonal and no product; "hutchinson" on a schedule takes them at its
    due steps; cp.create_graph(step) is False throughout."""
    made = problems.products_made(monkeypatch)
    cp = _mlp_steps(HessTrace(), 2)  # an extended MLP: BackPACK's exact diagonal
    assert cp.get_output()[1]["meta"]["HessTrace"]["curvature"] == "diag_h" and made == []
    cp = _mlp_steps(HessTrace(track_schedule=lambda s: s != 1, curvature="hutchinson", probes=2), 3)
    assert made == [0, 2] and not any(cp.create_graph(s) for s in range(4))


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


@pytest.mark.parametrize("max_passes", [-1, 1.5])
def test_max_passes_must_be_a_non_negative_integer(max_passes):
    with pytest.raises(ValueError, match="max_passes must be a non-negative integer"):
        HessTrace(max_passes=max_passes)


def test_max_passes_of_zero_takes_no_pass():
    """``max_passes=0`` is allowed: "auto" then takes no pass of the engine's exact GGN diagonal (2
    here, one per class but one), and the TIC says so; 2 passes are enough."""
    entry, _ = _plain_mlp_step([TICDiag(max_passes=0)])
    assert math.isnan(entry["TICDiag"]) and entry["meta"]["TICDiag"] == {"curvature": None}
    (flag,) = entry["flags"]
    assert "takes 2 backward passes per step" in flag and "more than max_passes=0" in flag
    entry, _ = _plain_mlp_step([TICDiag(max_passes=2)])
    assert entry["meta"]["TICDiag"] == {"curvature": "diag_ggn_exact", "passes": 2} and "flags" not in entry


def test_a_single_probe_is_allowed():
    cp = _mlp_steps(HessTrace(curvature="hutchinson", probes=1), 1)
    assert cp.get_output()[0]["meta"]["HessTrace"]["probes"] == 1


def _plain_mlp_step(quantities, steps=1):
    """``steps`` steps (no update) of a float64 MLP not extended for BackPACK (the engine's GGN
    diagonals serve it) on one batch: the last step's record and the brute-force GGN's traces per
    parameter."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0, 2])
    reference = [float(r) for r in _ggn_traces(copy.deepcopy(model), x, y)]
    cp = Cockpit(model, quantities, diagnose=False, strict=True)
    for step in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
    return cp.get_output()[steps - 1], reference


def test_an_explicit_monte_carlo_ggn_beyond_backpack_is_the_engines_with_its_probes_and_seed():
    """curvature="diag_ggn_mc" where BackPACK cannot serve (the model is not extended): the engine
    draws ``probes`` labels, one pass each, from the generator of ``seed``; within 4 of its
    standard errors of the exact traces, and another seed draws other labels."""
    entry, exact = _plain_mlp_step([HessTrace(curvature="diag_ggn_mc", probes=8, seed=1)])
    meta = entry["meta"]["HessTrace"]
    assert (meta["curvature"], meta["probes"], meta["passes"], meta["df"]) == ("diag_ggn_mc", 8, 8, 7)
    for value, se, reference in zip(entry["HessTrace"], meta["layers_se"], exact, strict=True):
        assert abs(value - reference) <= 4 * se
    other, _ = _plain_mlp_step([HessTrace(curvature="diag_ggn_mc", probes=8, seed=0)])
    assert all(a != b for a, b in zip(entry["HessTrace"], other["HessTrace"]))


def test_quantities_asking_for_the_exact_ggn_diagonal_share_one_computation(monkeypatch):
    """HessTrace(curvature="diag_ggn_exact", probes=...) and a TIC ("auto": the engine's exact GGN on a
    model BackPACK cannot serve) ask for the same diagonal, computed once (the probes are the
    Monte-Carlo diagonal's only); HessTrace's traces are the brute force's."""
    from cockpit_lite.curvature import ggn

    computed, diagonal = [], ggn.diagonal

    def counted(engine, info, request, needed_by):
        computed.append(request)
        return diagonal(engine, info, request, needed_by)

    monkeypatch.setattr(ggn, "diagonal", counted)
    entry, exact = _plain_mlp_step([HessTrace(curvature="diag_ggn_exact", probes=3), TICDiag()])
    assert computed == [ggn.Request(ggn.EXACT)]
    assert entry["HessTrace"] == pytest.approx(exact, rel=1e-10)
    assert entry["meta"]["TICDiag"] == {"curvature": "diag_ggn_exact", "passes": 2}


@pytest.mark.parametrize("curvature", ["diag_ggn_exact", "diag_ggn_mc"])
def test_the_engines_ggn_diagonal_watches_the_forward_pass_of_every_due_step(curvature):
    """HessTrace alone (no individual gradients of its own) with the engine's GGN diagonal: the
    engine watches every due step's forward pass, which the diagonal's passes read (unwatched, they
    would take the slow global path, with a warning); the exact traces are the brute force's."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entry, exact = _plain_mlp_step([HessTrace(curvature=curvature, probes=2)], steps=2)
    assert entry["meta"]["HessTrace"]["curvature"] == curvature
    if curvature == "diag_ggn_exact":
        assert entry["HessTrace"] == pytest.approx(exact, rel=1e-10)


class _TwoHeads(nn.Module):
    """Two outputs of disjoint parameters, ``a x₀`` and ``w tanh(v x₁)``: under squared errors the
    Hessian has no block across the heads, and ``a``'s block is its one entry."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor([0.5], dtype=torch.float64))
        self.v = nn.Parameter(torch.tensor([0.7], dtype=torch.float64))
        self.w = nn.Parameter(torch.tensor([-1.3], dtype=torch.float64))

    def forward(self, x):
        return torch.cat([self.a * x[:, :1], self.w * torch.tanh(self.v * x[:, 1:])], 1)


def test_the_total_s_standard_error_is_the_whole_network_s():
    """Hutchinson's estimate of ``a``'s trace is exact (``z_a (H z)_a = H_aa``: no cross term), so
    its standard error is 0; the whole network's is not (``v`` and ``w`` share a block), and the
    exact traces by autograd lie within 4 of their standard errors."""
    torch.manual_seed(0)
    model = _TwoHeads()
    x, y = torch.randn(6, 2, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    cp = Cockpit(model, [HessTrace(curvature="hutchinson", probes=4)], diagnose=False, strict=True)
    loss = nn.functional.mse_loss(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    entry = cp.get_output()[0]
    meta = entry["meta"]["HessTrace"]

    def loss_of(flat):
        a, v, w = flat.reshape(3, 1)
        return nn.functional.mse_loss(torch.cat([a * x[:, :1], w * torch.tanh(v * x[:, 1:])], 1), y)

    exact = torch.autograd.functional.hessian(loss_of, torch.tensor([0.5, 0.7, -1.3], dtype=torch.float64)).diagonal()
    assert meta["layers_se"][0] == 0 and entry["HessTrace"][0] == pytest.approx(float(exact[0]), rel=1e-12)
    assert meta["se"] > 0 and abs(sum(entry["HessTrace"]) - float(exact.sum())) <= 4 * meta["se"]
    for value, se, reference in zip(entry["HessTrace"][1:], meta["layers_se"][1:], exact[1:], strict=True):
        assert se > 0 and abs(value - float(reference)) <= 4 * se


def test_the_estimator_without_the_loss_is_refused_naming_the_quantity_and_the_fix():
    """Hutchinson's products differentiate info["loss"]: without it the step is refused, naming
    HessTrace and the fix, which works."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2)).double()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0])
    cp = Cockpit(model, [HessTrace(curvature="hutchinson", probes=2)], diagnose=False)
    loss = nn.functional.cross_entropy(model(x), y)
    with pytest.raises(ValueError, match=r"^HessTrace needs info\['loss'\] at step 0; pass it as cp\(step, info="):
        with cp(0):
            loss.backward()
    model.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert cp.get_output()[0]["meta"]["HessTrace"]["curvature"] == "hutchinson"
