"""The orchestrator: observer effect, cleanup, API contract, bad input."""

import math
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch import nn

import models
import problems
from cockpit_lite import Cockpit, configuration, extend, log, quantities, schedules
from cockpit_lite.engine import transforms
from backpack import extensions


def train(model_fn, steps, level=None, seed=0, batch=8):
    """Train a float32 model with SGD; with a Cockpit at ``level`` unless None. Returns the parameters."""
    torch.manual_seed(seed)
    model, lossfunc = model_fn(), nn.CrossEntropyLoss()
    if level is not None:
        model, lossfunc = extend(model), extend(lossfunc)
        cp = Cockpit(model.parameters(), quantities=configuration(level, extras=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(batch, 1, 6, 6, generator=data)
        y = torch.randint(0, 3, (batch,), generator=data)
        opt.zero_grad()
        loss = lossfunc(model(x), y)
        if level is None:
            loss.backward()
        else:
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward(create_graph=cp.create_graph(step))
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def cnn_with_dropout():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Dropout(0.3), nn.Flatten(), nn.Linear(64, 3)
    )


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 16), nn.Sigmoid(), nn.Linear(16, 3))


@pytest.mark.parametrize("model_fn", [mlp, cnn_with_dropout], ids=["mlp", "cnn_dropout"])
def test_observer_effect_is_zero_bit_for_bit(model_fn):
    """20 SGD steps with the full configuration give exactly the parameters of plain training.

    The dropout model consumes the global random state in every forward pass, so
    any random number drawn by the Cockpit would change the result.
    """
    plain = train(model_fn, 20)
    observed = train(model_fn, 20, level="full")
    for a, b in zip(plain, observed):
        assert torch.equal(a, b)


def _silu_mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.SiLU(), nn.Linear(8, 3))


def _silu_cnn():
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.SiLU(), nn.Flatten(), nn.Linear(72, 3))


def _classes(g, b):
    return torch.randint(0, 3, (b,), generator=g)


FLOAT64_MODELS = {
    # name: (model, loss class, input maker, target maker, extended)
    "resnet_bn_silu": (lambda: models.ResNet(models._batch_norm, nn.functional.silu), nn.CrossEntropyLoss,
                       problems._inputs((2, 4, 4)), _classes, False),
    "mlp_silu": (_silu_mlp, nn.CrossEntropyLoss, problems._inputs((6,)), _classes, False),
    "cnn_silu": (_silu_cnn, nn.CrossEntropyLoss, problems._inputs((1, 6, 6)), _classes, False),
    "weight_norm": (lambda: nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(6, 8)), nn.Tanh(),
                                          nn.Linear(8, 3)), nn.CrossEntropyLoss, problems._inputs((6,)), _classes, False),
    **{name: (*problems.BUILDERS[name], True) for name in problems.NAMES},
}
"""SiLU (EfficientNet's activation) is where PyTorch's backward differs in the last bit under
create_graph=True (another formula); BatchNorm in training mode carries that into every
sample; the plain problems take BackPACK's exact curvature (extended); weight_norm's fused backward has its
derivative replaced (``cockpit_lite.curvature.weight_norm``) and must still give the user's gradients."""


def _train_float64(name, steps, level=None):
    """SGD in float64, training mode; with a Cockpit at ``level`` (its Cockpit script's
    ``create_graph=cp.create_graph(step)``) unless None. Returns parameters, buffers, Cockpit."""
    build, loss_cls, inputs, targets, extended = FLOAT64_MODELS[name]
    torch.manual_seed(0)
    model, lossfunc = build().double(), loss_cls()
    if extended:
        model, lossfunc = extend(model), extend(lossfunc)
    hooks = _hooks(model)
    cp = Cockpit(model, quantities=configuration(level), diagnose=False) if level else None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    for step in range(steps):
        x, y = inputs(data, 4), targets(data, 4)
        opt.zero_grad()
        loss = lossfunc(model(x), y)
        if cp is None:
            loss.backward()
        else:
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward(create_graph=cp.create_graph(step))
            assert all(p.grad.grad_fn is None for p in model.parameters())
        opt.step()
    if cp is not None:
        cp.close()
        assert _hooks(model) == hooks
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())], cp


@pytest.mark.parametrize("name", list(FLOAT64_MODELS))
def test_observer_effect_is_zero_bit_for_bit_in_float64_with_curvature_at_every_step(name):
    """The full configuration (HessMaxEV, HessTrace at every step) leaves float64 training
    bit-identical: parameters and BatchNorm's running statistics after 3 steps."""
    plain, _ = _train_float64(name, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "auto" on an extended SiLU model: BackPACK cannot, estimated
        observed, cp = _train_float64(name, 3, "full")
    assert all(torch.equal(a, b) for a, b in zip(plain, observed))
    assert all(math.isfinite(cp.get_output()[s]["HessMaxEV"]) for s in range(3))
    assert all(math.isfinite(sum(cp.get_output()[s]["HessTrace"])) for s in range(3))


def test_monte_carlo_curvature_draws_from_a_private_random_state():
    """``curvature="diag_ggn_mc"`` is the one option that draws random numbers (BackPACK's
    MC sampling of the loss's output Hessian): with dropout consuming the global random
    state in every forward pass, training stays bit-identical to plain training.
    """

    def train_with(curvature):
        torch.manual_seed(0)
        model, lossfunc = cnn_with_dropout(), nn.CrossEntropyLoss()
        if curvature is not None:
            model, lossfunc = extend(model), extend(lossfunc)
            cp = Cockpit(model, quantities=[quantities.HessTrace(curvature=curvature), quantities.TICDiag(curvature=curvature)])
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(1)
        for step in range(8):
            x, y = torch.randn(8, 1, 6, 6, generator=data), torch.randint(0, 3, (8,), generator=data)
            opt.zero_grad()
            loss = lossfunc(model(x), y)
            if curvature is None:
                loss.backward()
            else:
                with cp(step, info={"loss": loss, "optimizer": opt}):
                    loss.backward()
            opt.step()
        if curvature is not None:
            assert cp.get_output()[7]["meta"]["HessTrace"]["curvature"] == curvature
        return [p.detach().clone() for p in model.parameters()], torch.get_rng_state()

    plain, plain_rng = train_with(None)
    observed, observed_rng = train_with("diag_ggn_mc")
    assert torch.equal(plain_rng, observed_rng)
    for a, b in zip(plain, observed):
        assert torch.equal(a, b)


def _hooks(model):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()]


def test_nothing_is_left_on_the_model_after_the_block():
    """Between steps only the capture's forward hooks stay, and only if the next step is due."""
    problem = problems.make("cnn", 4)
    model = problem.model
    hooks_before = _hooks(model)
    attributes_before = [set(vars(p)) for p in model.parameters()]
    cp, _ = problems.run(problem, configuration("full", track_schedule=schedules.linear(10)), steps=2)
    assert _hooks(model) == hooks_before  # step 2 is not due: no hook
    cp, _ = problems.run(problem, configuration("full"))
    assert _hooks(model) != hooks_before  # armed for the next step
    assert not cp.engine.capture.calls and not cp.engine.capture._tensor_handles
    cp.close()
    assert _hooks(model) == hooks_before
    assert [set(vars(p)) for p in model.parameters()] == attributes_before
    for p in model.parameters():
        assert p.grad.grad_fn is None  # the graph kept for HessMaxEV is released
    from backpack.context import CTX

    assert not CTX.get_active_exts()
    assert not any(hasattr(m, "output") or hasattr(m, "input0") for m in model.modules())


def test_individual_gradients_are_dropped_layer_by_layer(monkeypatch):
    """When a layer's transforms run, the previous layer's individual gradients are gone."""
    alive = []

    class Probe(transforms.Transform):
        key = "probe"

        def __call__(self, per_sample):
            assert all(ref() is None for ref in alive), "an earlier layer's grad_batch is still alive"
            alive.append(weakref.ref(per_sample.grad_batch))
            return per_sample.grad.sum()

    class ProbeQuantity(quantities.SingleStepQuantity):
        TRANSFORMS = (Probe,)

        def compute(self, step, data):
            return quantities.Output(sum(data.per_sample("probe")))

    problem = problems.make("cnn", 3, steps=1)
    problems.run(problem, [ProbeQuantity()])
    assert len(alive) == len(list(problem.model.parameters()))


def test_user_extensions_are_computed_and_left_on_the_parameters():
    problem = problems.make("mlp", 3, steps=1)
    x, y = problem.batches[0]
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.1)
    cp = Cockpit(problem.model, [quantities.HessTrace(), quantities.NormTest()])
    loss = problem.lossfunc(problem.model(x), y)
    with cp(0, extensions.BatchGrad(), extensions.DiagHessian(), info={"loss": loss, "optimizer": opt}):
        loss.backward()
    for p in problem.model.parameters():
        assert p.grad_batch.shape == (3, *p.shape)
        torch.testing.assert_close(p.grad_batch.sum(0), p.grad)
        assert p.diag_h.shape == p.shape
    trace = cp.get_output()[0]["HessTrace"]
    assert trace == pytest.approx([float(p.diag_h.sum()) for p in problem.model.parameters()])


def test_nothing_due_means_no_backpack(monkeypatch):
    import cockpit_lite.step_context

    entered = []
    monkeypatch.setattr(cockpit_lite.step_context, "backpack", lambda *exts: entered.append(exts))
    problem = problems.make("mlp", 3, steps=2)
    cp, _ = problems.run(problem, [quantities.NormTest(track_schedule=schedules.linear(5, offset=2))])
    assert cp.get_output() == {} and entered == []
    assert not cp.create_graph(0)


def test_step_must_increase():
    problem = problems.make("mlp", 3)
    cp = Cockpit(problem.model, [quantities.GradNorm()])
    cp(3)
    for bad in (3, 2):
        with pytest.raises(ValueError, match="must increase"):
            cp(bad)
    with pytest.raises(ValueError, match="integer"):
        cp(4.0)


def test_create_graph_is_never_needed():
    """HessMaxEV takes its products before the backward pass: cp.create_graph(step) is False at
    due steps too (kept for Cockpit scripts, whose loss.backward(create_graph=...) stays plain)."""
    problem = problems.make("mlp", 3)
    cp = Cockpit(problem.model, [quantities.HessMaxEV(track_schedule=schedules.linear(3))])
    assert [cp.create_graph(s) for s in range(5)] == [False] * 5


def test_missing_info_key_names_key_and_quantity_before_backward():
    problem = problems.make("mlp", 3)
    cp = Cockpit(problem.model, [quantities.Loss()])
    with pytest.raises(ValueError, match=r"Loss needs info\['loss'\] at step 0"):
        cp(0, info={})
    with pytest.raises(ValueError, match="scalar tensor"):
        cp(1, info={"loss": 1.0})


def test_batch_size_is_derived_and_checked():
    problem = problems.make("mlp", 3, steps=1)
    x, y = problem.batches[0]
    cp = Cockpit(problem.model, [quantities.NormTest()])
    loss = problem.lossfunc(problem.model(x), y)
    with pytest.raises(ValueError, match=r"info\['batch_size'\] is 4 .* shape \(3, 6\)"):
        with cp(0, info={"loss": loss, "batch_size": 4}):
            loss.backward()


def test_model_not_extended_gets_first_order_quantities():
    model = nn.Sequential(nn.Linear(4, 3))
    cp = Cockpit(model, [quantities.NormTest()])
    loss = nn.CrossEntropyLoss()(model(torch.randn(3, 4)), torch.tensor([0, 1, 2]))
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert math.isfinite(cp.get_output()[0]["NormTest"])


def test_loss_not_extended_for_second_order():
    """An explicit BackPACK curvature is refused before backward, naming the fix; the fix works."""
    model = extend(nn.Sequential(nn.Linear(4, 3)))
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 2])
    cp = Cockpit(model, [quantities.HessTrace(curvature="diag_h")], diagnose=False)
    loss = nn.CrossEntropyLoss()(model(x), y)
    with pytest.raises(ValueError, match=r"HessTrace cannot use curvature='diag_h'.*extended CrossEntropyLoss.*cockpit_lite.extend"):
        cp(0, info={"loss": loss})
    loss = extend(nn.CrossEntropyLoss())(model(x), y)  # the fix
    with cp(1, info={"loss": loss}):
        loss.backward()
    assert cp.get_output()[1]["meta"]["HessTrace"] == {"curvature": "diag_h"}


def test_in_place_activation_is_refused_by_extend():
    with pytest.raises(ValueError, match=r"1 \(ReLU\(inplace=True\)\).*inplace=False"):
        extend(nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True)))


def test_frozen_parameters_are_left_out_with_a_warning():
    model = extend(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3)))
    model[0].weight.requires_grad_(False)
    with pytest.warns(UserWarning, match=r"1 parameter\(s\) with requires_grad=False.*0\.weight"):
        cp = Cockpit(model, configuration("economy"))
    assert cp.names == ["0.bias", "2.weight", "2.bias"]
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for step in range(2):
        opt.zero_grad()
        loss = extend(nn.CrossEntropyLoss())(model(torch.randn(3, 4)), torch.tensor([0, 1, 2]))
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    assert len(cp.get_output()[0]["GradNorm"]) == 3
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="none of the parameters"):
        Cockpit(model.parameters())


def test_unused_parameter_counts_as_zero_gradient():
    model = extend(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3)))
    spare = nn.Parameter(torch.ones(2))
    cp = Cockpit(list(model.parameters()) + [spare], [quantities.GradVariance(), quantities.GradNorm()])
    loss = extend(nn.CrossEntropyLoss())(model(torch.randn(3, 4)), torch.tensor([0, 1, 2]))
    with cp(0, info={"loss": loss}):
        loss.backward()
    entry = cp.get_output()[0]
    assert entry["GradVariance"][-1] == 0 and entry["GradNorm"][-1] == 0


def nan_run(strict):
    """Train 4 steps; a sample of step 1 is NaN and the user skips that update (as AMP does)."""
    problem = problems.make("mlp", 4, steps=4)
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.1)
    cp = Cockpit(problem.model, configuration("full"), strict=strict)
    for step, (x, y) in enumerate(problem.batches):
        opt.zero_grad()
        if step == 1:
            x = x.clone()
            x[0, 0] = float("nan")
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward(create_graph=cp.create_graph(step))
        if torch.isfinite(loss):
            opt.step()
    return cp.get_output()


class _Root(nn.Module):
    """``Σ x·√w`` with ``w`` of two float64 entries and a float32 scale: at ``w = 0`` the loss is finite
    (0) and ``∂/∂w = x / (2√w)`` is +Inf."""

    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float64))
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return (x * torch.sqrt(self.w)).sum() * self.scale


@pytest.mark.parametrize("quantity", ["Loss", "GradNorm"])  # without and with the gradient norms formed
def test_a_non_finite_gradient_of_a_finite_loss_is_flagged(quantity):
    """Whether or not a due quantity forms the gradient norms, the step's record says its gradient is
    not finite (the flag ``nonfinite_grad``, not ``nonfinite_loss``), and only then."""
    records = {}
    for w in ([0.0, 1.0], [4.0, 1.0]):  # √0's gradient is +Inf; √4's is finite
        model = _Root(w)
        cp = Cockpit(model, [getattr(quantities, quantity)()], diagnose=False)
        loss = model(torch.ones(2, dtype=torch.float64))
        with cp(0, info={"loss": loss}):
            loss.backward()
        assert math.isfinite(loss.item()) and not torch.isfinite(model.w.grad).all() == (w[0] == 0)
        records[w[0]] = cp.get_output()[0].get("flags", [])
    assert records == {0.0: ["nonfinite_grad"], 4.0: []}


def test_nan_loss_is_recorded_and_flagged_and_training_goes_on():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = nan_run(strict=False)
    assert record[1]["flags"][:2] == ["nonfinite_loss", "nonfinite_grad"] or set(record[1]["flags"]) >= {
        "nonfinite_loss",
        "nonfinite_grad",
    }
    assert math.isnan(record[1]["Loss"]) and math.isnan(record[1]["NormTest"])
    assert record[1]["GradHist1d"]["nonfinite"] > 0
    for step in (0, 2):  # step 0 (before the NaN step) and step 2 (after it) are clean
        assert math.isfinite(record[step]["NormTest"])
    assert "flags" not in record[2]
    # α of step 0 spans the NaN step, and says so; step 2 → 3 is clean again
    assert math.isnan(record[0]["Alpha"])
    assert [f for f in record[0]["flags"] if not f.startswith("Alpha: the individual losses are not finite")] == []
    assert math.isfinite(record[2]["Alpha"]) and math.isfinite(record[3]["HessMaxEV"])


def test_nan_loss_raises_in_strict_mode_after_recording():
    with pytest.raises(FloatingPointError, match="step 1: nonfinite_loss"):
        nan_run(strict=True)


def test_a_failing_quantity_is_flagged_not_fatal():
    class Broken(quantities.SingleStepQuantity):
        def compute(self, step, data):
            raise RuntimeError("boom")

    problem = problems.make("mlp", 3, steps=1)
    x, y = problem.batches[0]
    cp = Cockpit(problem.model, [Broken(), quantities.GradNorm()])
    loss = problem.lossfunc(problem.model(x), y)
    with pytest.warns(UserWarning, match="Broken failed at step 0"):
        with cp(0, info={"loss": loss}):
            loss.backward()
    entry = cp.get_output()[0]
    assert math.isnan(entry["Broken"]) and "Broken: RuntimeError: boom" in entry["flags"]
    assert len(entry["GradNorm"]) == 4


def test_json_lines_log_and_cockpit_layout_json(tmp_path):
    problem = problems.make("mlp", 3, steps=3)
    cp, _ = problems.run(problem, configuration("economy"), log=tmp_path / "run.jsonl")
    cp.log(2, 0, 1.0, 1.1, 1.2, 0.5, 0.4, 0.3, 0.1)
    cp.close()
    header, record = log.read_jsonl(tmp_path / "run.jsonl")
    assert header["params"][0] == {"name": "0.weight", "shape": [5, 6]}
    assert header["quantities"] == [q.name for q in cp.quantities]
    assert record.keys() == cp.get_output().keys()
    for step, entry in cp.get_output().items():
        assert entry.keys() == record[step].keys()
        assert record[step]["NormTest" if "NormTest" in entry else "train_loss"] == pytest.approx(
            entry["NormTest" if "NormTest" in entry else "train_loss"]
        )
    np.testing.assert_array_equal(record[0]["GradHist1d"]["hist"], cp.get_output()[0]["GradHist1d"]["hist"])
    path = cp.write(tmp_path / "out" / "run")
    assert path.endswith("run.json")
    again = log.read_json(path)
    assert again[1]["Alpha"] == pytest.approx(cp.get_output()[1]["Alpha"])
    assert again[2]["test_accuracy"] == 0.3


def test_each_quantity_class_once():
    problem = problems.make("mlp", 3)
    with pytest.raises(ValueError, match="tracked already"):
        Cockpit(problem.model, [quantities.GradNorm(), quantities.GradNorm()])
    with pytest.raises(ValueError, match="Quantity instances"):
        Cockpit(problem.model, [quantities.GradNorm])


def _one_step(cp, model, step, x=None, y=None):
    x = torch.randn(4, 6, dtype=torch.float64) if x is None else x
    y = torch.tensor([0, 1, 2, 0]) if y is None else y
    loss = nn.functional.cross_entropy(model(x), y)
    with cp(step, info={"loss": loss}):
        loss.backward()
    return loss


def test_a_quantity_belongs_to_one_cockpit_and_the_fix_works():
    """A sweep reusing one list would carry run 1's θ₀ into run 2: refused, naming the fix."""
    shared = configuration("economy")
    problem = problems.make("mlp", 3)
    Cockpit(problem.model, shared, diagnose=False)
    with pytest.raises(ValueError, match="already belongs to another Cockpit.*built anew for every run"):
        Cockpit(problem.model, shared, diagnose=False)
    for _ in range(2):  # the fix: a fresh list per run; Distance starts from each run's own θ₀
        problem = problems.make("mlp", 3, steps=1)
        cp, _ = problems.run(problem, configuration("economy"))
        assert cp.get_output()[0]["Distance"] == [0.0] * len(list(problem.model.parameters()))


def test_nested_or_unexited_contexts_are_refused_with_the_fix():
    model = nn.Sequential(nn.Linear(6, 3)).double()
    cp = Cockpit(model, [quantities.GradNorm()], diagnose=False)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 6, dtype=torch.float64)), torch.tensor([0, 1, 2, 0]))
    outer = cp(0, info={"loss": loss})
    outer.__enter__()
    with pytest.raises(ValueError, match="context of step 0 is still open.*one after the other"):
        cp(1, info={"loss": loss})
    loss.backward()
    outer.__exit__(None, None, None)
    with pytest.raises(ValueError, match="entered twice"):
        outer.__enter__()
    _one_step(cp, model, 1)  # the fix: one with-block per step
    assert set(cp.get_output()) == {0, 1}


def test_a_closed_cockpit_refuses_to_track():
    model = nn.Sequential(nn.Linear(6, 3)).double()
    cp = Cockpit(model, [quantities.GradNorm()], diagnose=False)
    _one_step(cp, model, 0)
    cp.close()
    cp.close()  # twice: nothing
    with pytest.raises(ValueError, match="was closed.*create a new"):
        _one_step(cp, model, 1)
    with pytest.raises(ValueError, match="was closed"):
        cp.log(1, 0, 1.0, None, None, None, None, None, 0.1)
    fresh = Cockpit(model, [quantities.GradNorm()], diagnose=False)  # the fix
    _one_step(fresh, model, 1)
    assert 1 in fresh.get_output() and 0 in cp.get_output()


def test_an_empty_batch_is_refused_with_the_fix():
    model = nn.Sequential(nn.Linear(6, 3)).double()
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False)
    with pytest.raises(ValueError, match="batch is empty.*drop_last=True"):
        _one_step(cp, model, 0, torch.randn(0, 6, dtype=torch.float64), torch.zeros(0, dtype=torch.long))
    _one_step(cp, model, 1)  # the fix: the next (non-empty) batch is tracked
    assert math.isfinite(cp.get_output()[1]["NormTest"])


def test_a_detached_loss_names_the_fix():
    """Where the samples' losses must be read from the loss (here: a parameter no module owns,
    on the global path), a detached ``info["loss"]`` is refused before backward, naming the fix."""
    weight = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    cp = Cockpit([weight], [quantities.NormTest()], diagnose=False)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    loss = nn.functional.cross_entropy(x @ weight.T, y)
    with pytest.raises(ValueError, match="has no autograd graph.*the one loss.backward"):
        with cp(0, info={"loss": loss.detach()}):
            loss.backward()
    weight.grad = None
    loss = nn.functional.cross_entropy(x @ weight.T, y)
    with cp(1, info={"loss": loss}):  # the fix
        loss.backward()
    assert math.isfinite(cp.get_output()[1]["NormTest"])


def test_no_backward_inside_the_context_is_nan_and_flagged_at_every_step():
    """Without a backward pass of info["loss"] in the block the gradients are stale (here:
    none): NaN and a flag naming the fix at each such step, not zeros; Loss is still recorded."""
    model = nn.Sequential(nn.Linear(6, 3)).double()
    cp = Cockpit(model, [quantities.GradNorm(), quantities.NormTest(), quantities.Loss()], diagnose=False)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    for step in range(2):
        loss = nn.functional.cross_entropy(model(x), y)
        with pytest.warns(UserWarning, match="no backward pass of info\\['loss'\\] ran inside"):
            with cp(step, info={"loss": loss}):
                pass
        entry = cp.get_output()[step]
        assert math.isnan(entry["GradNorm"]) and math.isnan(entry["NormTest"])
        assert entry["Loss"] == pytest.approx(float(loss))
        assert any("call loss.backward() inside" in f for f in entry["flags"])
    _one_step(cp, model, 2, x, y)  # the fix
    assert math.isfinite(cp.get_output()[2]["NormTest"]) and "flags" not in cp.get_output()[2]


def test_a_batch_of_one_sample_has_no_variance():
    """B = 1: the statistics over samples are NaN with one flag naming the fix (not ±inf or a
    huge MeanGSNR), without torch's warnings; the ones defined for one sample stay finite."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, configuration("economy", extras=True), diagnose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.randn(1, 6, dtype=torch.float64)), torch.tensor([1]))
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            opt.step()
    entry = cp.get_output()[1]
    for name in ("NormTest", "InnerTest", "OrthoTest", "GradVariance", "MeanGSNR", "Alpha"):
        assert math.isnan(entry[name]), name
    assert all(math.isfinite(v) for v in entry["GradNorm"]) and entry["GradHist1d"]["hist"].sum() > 0
    assert sum("at least 2 samples" in f for f in entry["flags"]) == 1
    assert any("Alpha: a batch of one sample" in f for f in entry["flags"])


def test_the_tracked_set_is_reread_at_every_tracked_step():
    """Frozen after construction: out of every statistic (against the brute force over the
    trainable parameters), said once; a parameter replaced by assignment: its new tensor,
    by name; a layer added later: said, not silently missing."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    cp = Cockpit(model, [quantities.NormTest(), quantities.GradNorm()], diagnose=False)
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    _one_step(cp, model, 0, x, y)
    model.zero_grad()
    model[0].requires_grad_(False)
    with pytest.warns(UserWarning, match="0.weight no longer requires a gradient"):
        _one_step(cp, model, 1, x, y)
    per_sample = nn.functional.cross_entropy(model(x), y, reduction="none") / 8
    trainable = [model[2].weight, model[2].bias]
    rows = torch.stack([8 * torch.cat([g.reshape(-1) for g in torch.autograd.grad(per_sample[n], trainable, retain_graph=True)])
                        for n in range(8)])
    g = rows.mean(0)
    expected = torch.sqrt(((rows - g) ** 2).sum() / (7 * 8 * (g**2).sum()))
    problems.assert_close(cp.get_output()[1]["NormTest"], expected, what="NormTest, frozen after construction")
    assert cp.get_output()[1]["GradNorm"][:2] == [0.0, 0.0]
    frozen = [f for f in cp.get_output()[1]["flags"] if f.startswith("NormTest: 0.")]
    assert len(frozen) == 2 and all("is frozen (requires_grad=False)" in f for f in frozen), frozen
    model.zero_grad()
    model[2].weight = nn.Parameter(torch.randn(3, 5, dtype=torch.float64))
    model.add_module("3", nn.Linear(3, 3).double())
    with pytest.warns(UserWarning) as caught:
        loss = _one_step(cp, model, 2, x, y)
    messages = " ".join(str(w.message) for w in caught)
    assert "2.weight was replaced" in messages and "3.weight, 3.bias joined the model" in messages
    problems.assert_close(cp.get_output()[2]["GradNorm"][2], model[2].weight.grad.norm(), what="GradNorm, replaced")
    assert loss.requires_grad


# -- gradient accumulation (Cockpit(accumulate=True)); the numbers: tests/engine/test_window.py --


def _accumulating(cp, model, opt, steps=3, micro=2, closure=False, seed=0):
    """Two micro-batches of 4 per optimizer step, each ``loss / micro`` in ``cp(step)``."""
    data = torch.Generator().manual_seed(seed)
    for step in range(steps):
        opt.zero_grad()
        batches = [(torch.randn(4, 4, generator=data, dtype=torch.float64), torch.randint(0, 3, (4,), generator=data))
                   for _ in range(micro)]

        def backward(x, y):
            loss = nn.functional.cross_entropy(model(x), y) / micro
            if cp is None:
                loss.backward()
                return loss
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            return loss

        for x, y in batches[:-1]:
            backward(x, y)
        if closure:  # Lightning's way: the last micro-batch runs inside optimizer.step(closure)
            opt.step(lambda: backward(*batches[-1]))
        else:
            backward(*batches[-1])
            opt.step()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).double()


def test_a_repeated_step_names_accumulate_and_accumulate_works():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"accumulate=True and enter cp\(step\) around every micro-batch"):
        _accumulating(Cockpit(model, [quantities.NormTest()], diagnose=False), model, opt)
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, accumulate=True)
    _accumulating(cp, model, opt)
    assert all(cp.get_output()[s]["batch"] == {"size": 8, "accumulated": False, "passes": 2} for s in range(3))


def test_accumulate_needs_the_optimizer_and_says_so():
    model = _mlp()
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, accumulate=True)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 4, dtype=torch.float64)), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match=r"Cockpit\(accumulate=True\) needs info\['optimizer'\]"):
        cp(0, info={"loss": loss})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with cp(0, info={"loss": loss, "optimizer": opt}):  # the fix
        loss.backward()
    opt.step()
    assert "NormTest" in cp.get_output()[0]


def test_a_micro_batch_after_the_optimizer_stepped_is_refused_with_the_fix():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, accumulate=True)
    _accumulating(cp, model, opt, steps=1)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 4, dtype=torch.float64)), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match=r"completed by optimizer.step\(\).*number the steps by optimizer steps"):
        cp(0, info={"loss": loss, "optimizer": opt})


def test_the_step_completes_when_the_optimizer_steps_also_with_a_closure():
    """The record exists right after ``optimizer.step()``; ``step(closure)`` running the last
    micro-batch gives the same record as the plain loop."""
    records = []
    for closure in (False, True):
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        cp = Cockpit(model, [quantities.NormTest(), quantities.Alpha(), quantities.GradNorm()], diagnose=False,
                     accumulate=True)
        _accumulating(cp, model, opt, steps=3, closure=closure)
        assert sorted(cp.get_output()) == [0, 1, 2]  # before close(): step 2 completed by its optimizer step
        assert not opt._optimizer_step_pre_hooks, "the Cockpit's hooks are gone after the step"
        records.append(cp.get_output())
        cp.close()
    for step in range(3):
        assert records[1][step]["batch"]["passes"] == 2
        for name in ("NormTest", "GradNorm") + (("Alpha",) if step < 2 else ()):
            problems.assert_close(records[1][step][name], records[0][step][name], rtol=1e-12, what=name)


def test_a_step_the_optimizer_skipped_completes_at_the_next_step_or_close():
    """A GradScaler skips ``optimizer.step()`` on an overflow: the step is recorded at the next
    ``cp`` (or ``close()``, or ``complete_step()``)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, accumulate=True)
    data = torch.Generator().manual_seed(0)
    for step in range(3):
        for _ in range(2):
            loss = nn.functional.cross_entropy(model(torch.randn(4, 4, generator=data, dtype=torch.float64)),
                                               torch.randint(0, 3, (4,), generator=data)) / 2
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
        assert sorted(cp.get_output()) == list(range(step))  # no optimizer step: not yet recorded
        opt.zero_grad()
        if step == 1:
            cp.complete_step()
            assert sorted(cp.get_output()) == [0, 1]
    cp.close()
    assert sorted(cp.get_output()) == [0, 1, 2] and all(cp.get_output()[s]["batch"]["passes"] == 2 for s in range(3))


def test_curvature_of_several_micro_batches_is_nan_with_a_flag():
    model = extend(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [quantities.HessMaxEV(), quantities.HessTrace(), quantities.NormTest()], diagnose=False,
                 accumulate=True)
    _accumulating(cp, model, opt, steps=1)
    entry = cp.get_output()[0]
    assert math.isnan(entry["HessMaxEV"]) and math.isnan(entry["HessTrace"]) and math.isfinite(entry["NormTest"])
    assert any("HessMaxEV: the curvature of an accumulated step (2 backward passes)" in f for f in entry["flags"])
    cp2 = Cockpit(model, [quantities.HessMaxEV()], diagnose=False, accumulate=True)
    _accumulating(cp2, model, opt, steps=1, micro=1)  # one backward pass per step: computed
    assert math.isfinite(cp2.get_output()[0]["HessMaxEV"])


def test_accumulation_does_not_change_training_and_leaves_nothing_behind():
    """Parameters and BatchNorm statistics bit for bit against the loop without a Cockpit; no
    optimizer hook, BackPACK buffer or module hook left once the step is complete."""
    states = []
    for level in (None, "full"):
        model = extend(_mlp())
        hooks = lambda: [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]  # noqa: E731
        before = hooks()  # BackPACK's own, from extend
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        cp = None if level is None else Cockpit(model, configuration(level), accumulate=True)
        _accumulating(cp, model, opt, steps=3)
        states.append(model.state_dict())
        if cp is not None:
            assert not opt._optimizer_step_pre_hooks
            assert not any(hasattr(p, f) for p in model.parameters() for f in ("diag_h", "diag_ggn_exact", "grad_batch"))
            cp.close()
            assert hooks() == before
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


def test_state_dict_between_micro_batches_is_refused_with_the_fix():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, accumulate=True)
    loss = nn.functional.cross_entropy(model(torch.randn(4, 4, dtype=torch.float64)), torch.tensor([0, 1, 2, 0]))
    with cp(0, info={"loss": loss, "optimizer": opt}):
        loss.backward()
    with pytest.raises(ValueError, match=r"save after optimizer.step\(\)"):
        cp.state_dict()
    opt.step()
    assert cp.state_dict()["last_step"] == 0


def test_a_scaled_backward_pass_is_flagged_and_the_named_fix_recovers_the_values():
    """``scaler.scale(loss).backward()`` with ``info["loss"] = loss``: the gradient the Cockpit sees
    is S times the one the optimizer steps with. The step is flagged with the scale (it used to be
    recorded silently, GradNorm 1024x), naming the due quantities that read the scale, and dividing
    by the scale, as the flag says, gives the values of the unscaled run; the gradient tests are the
    same without it. A step of scale-free quantities only (Alpha, under strict=True in
    tests/quantities/test_alpha.py) is not flagged."""
    records = []
    for scale in (None, 2.0**10):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()  # no BatchNorm: no zero variance
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=scale or 1.0, enabled=scale is not None)
        cp = Cockpit(model, [quantities.GradNorm(), quantities.GradVariance(), quantities.NormTest()], diagnose=False)
        data = torch.Generator().manual_seed(1)
        x, y = torch.randn(8, 4, generator=data, dtype=torch.float64), torch.randint(0, 3, (8,), generator=data)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cp(0, info={"loss": loss, "optimizer": opt}):
                scaler.scale(loss).backward()
        scaler.step(opt)
        cp.close()
        records.append((cp.get_output()[0], [str(w.message) for w in caught], scaler.get_scale()))
    (plain, plain_warned, _), (scaled, warned, s) = records
    assert "flags" not in plain and not any("scaled by" in w for w in plain_warned)
    (flag,) = [f for f in scaled["flags"] if "was scaled by 1024" in f]
    assert "GradNorm, GradVariance describe the scaled gradient" in flag and "scaler.get_scale()" in flag
    assert any("was scaled by 1024" in w for w in warned)
    problems.assert_close(np.asarray(scaled["GradNorm"]) / s, plain["GradNorm"], rtol=1e-12, what="GradNorm")
    problems.assert_close(np.asarray(scaled["GradVariance"]) / s**2, plain["GradVariance"], rtol=1e-12,
                          what="GradVariance")
    problems.assert_close(scaled["NormTest"], plain["NormTest"], rtol=1e-12, what="NormTest")


def test_a_divided_loss_under_accumulation_is_no_scale():
    """``(loss / 2).backward()`` per micro-batch with ``info["loss"] = loss`` defines the effective
    batch's statistics (accumulate=True): σ = 1/2 is no loss scale, nothing is flagged."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, accumulate=True)
    data = torch.Generator().manual_seed(0)
    for _ in range(2):
        loss = nn.functional.cross_entropy(model(torch.randn(4, 4, generator=data, dtype=torch.float64)),
                                           torch.randint(0, 3, (4,), generator=data))
        with cp(0, info={"loss": loss, "optimizer": opt}):
            (loss / 2).backward()
    opt.step()
    cp.close()
    assert not any("scaled by" in f for f in cp.get_output()[0].get("flags", []))
