"""Parameters without their model (Cockpit's recipe): the engine finds the modules that own
them in the forward pass, serves them by the fast layer rules, and leaves no hook behind."""

import math

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

import problems
from cockpit_lite import Cockpit, configuration, quantities
from cockpit_lite.engine import global_path

FIRST_ORDER = ("NormTest", "InnerTest", "OrthoTest", "GradVariance", "MeanGSNR", "GradNorm", "Alpha")


def _first_order():
    return [quantities.REGISTRY[name]() for name in FIRST_ORDER] + [quantities.GradHist1d()]


def _global_path_calls(monkeypatch):
    calls = []
    original = global_path.individual_gradients

    def spy(contributions, params, mode=None):
        calls.append(len(params))
        return original(contributions, params, mode)

    monkeypatch.setattr(global_path, "individual_gradients", spy)
    return calls


def _assert_records_equal(a, b, what):
    assert set(a) == set(b), what
    assert "Alpha" in a[0] and "Alpha" in b[0], what  # two-step: recorded for every step but the last
    for step in a:
        for name in (n for n in FIRST_ORDER if n in a[step] or n in b[step]):
            problems.assert_close(b[step][name], a[step][name], rtol=1e-10, atol=1e-14, what=f"{name}, {what}")
        assert (a[step]["GradHist1d"]["hist"] == b[step]["GradHist1d"]["hist"]).all(), what


@pytest.mark.parametrize("name", sorted(problems.BUILDERS))
def test_both_recipes_give_the_same_numbers(name):
    """``Cockpit(model)`` and ``Cockpit(model.parameters())`` on every test model (the plain ones
    BackPACK-extended, as in Cockpit's recipe): the same first-order record."""
    records = []
    for params_only in (False, True):
        problem = problems.make(name, 4, steps=2)
        cp, _ = problems.run(problem, _first_order(), optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
                             params_only=params_only)
        records.append(cp.get_output())
    _assert_records_equal(*records, name)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "resnet_gn", "gpt"])
def test_parameters_are_served_by_the_layer_rules(name, monkeypatch):
    """No parameter of a model without BatchNorm in training mode takes the global path (B backward passes)."""
    calls = _global_path_calls(monkeypatch)
    problem = problems.make(name, 4, steps=2)
    cp, snapshots = problems.run(problem, [quantities.NormTest()], params_only=True)
    assert calls == []
    assert cp.engine.model is problem.model
    for step, snapshot in snapshots.items():
        individual = torch.cat([g.reshape(g.shape[0], -1) for g in problems.individual_gradients(problem, snapshot)], 1)
        b, g = individual.shape[0], individual.mean(0)
        expected = torch.sqrt(((individual - g) ** 2).sum() / ((b - 1) * b * (g**2).sum()))
        problems.assert_close(cp.get_output()[step]["NormTest"], expected, what=f"NormTest params-only rules {name}")


def test_layers_before_a_training_batchnorm_still_take_the_global_path(monkeypatch):
    """As with the model: the samples are coupled upstream of BatchNorm in training mode."""
    calls = _global_path_calls(monkeypatch)
    problem = problems.make("resnet_bn_train", 4, steps=1)
    problems.run(problem, [quantities.NormTest()], params_only=True)
    tracked = len(list(problem.model.parameters()))
    assert calls and 0 < calls[0] < tracked


def test_an_untracked_step_has_no_hook():
    """Global module hooks only while discovering, module hooks only before due steps."""
    problem = problems.make("mlp", 4, steps=4)
    model = problem.model
    before = {id(m): (len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()}
    others = len(torch_module._global_forward_pre_hooks) + len(torch_module._global_forward_hooks)
    cp = Cockpit(model.parameters(), [quantities.NormTest(track_schedule=lambda s: s in (0, 2))], diagnose=False)
    assert torch_module._global_forward_pre_hooks  # armed for step 0, before the model is known
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks_at = {}
    for step, (x, y) in enumerate(problem.batches):
        hooks_at[step] = (
            len(torch_module._global_forward_pre_hooks) + len(torch_module._global_forward_hooks) - others,
            sum(len(m._forward_hooks) + len(m._forward_pre_hooks) - sum(before[id(m)]) for m in model.modules()),
        )
        opt.zero_grad()
        loss = problem.lossfunc(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
        opt.step()
    assert hooks_at[0][0] == 2  # the discovering step
    assert hooks_at[1] == (0, 0) and hooks_at[3] == (0, 0)  # untracked: nothing
    assert hooks_at[2][0] == 0 and hooks_at[2][1] > 0  # due again: per-module hooks on the found model
    cp.close()
    assert len(torch_module._global_forward_pre_hooks) + len(torch_module._global_forward_hooks) == others


def test_a_cockpit_dropped_unclosed_or_on_functional_code_leaves_no_global_hook():
    """Parameters no module owns: the engine stops looking after the first watched forward pass;
    a Cockpit dropped before any step: its global hooks go with it."""
    import gc

    hooks = lambda: len(torch_module._global_forward_pre_hooks) + len(torch_module._global_forward_hooks)  # noqa: E731
    gc.collect()
    before = hooks()
    weight = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    cp = Cockpit([weight], [quantities.NormTest()], diagnose=False)
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    loss = nn.CrossEntropyLoss()(x @ weight.T, y)  # a module ran (the loss), owning nothing tracked
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert hooks() == before and math.isfinite(cp.get_output()[0]["NormTest"])
    Cockpit(list(problems.make("mlp", 3).model.parameters()), [quantities.NormTest()], diagnose=False)
    gc.collect()
    assert hooks() == before


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)

    def forward(self, x):
        return self.lin(x)


def test_modules_called_one_after_the_other_and_a_bare_parameter(monkeypatch):
    """An encoder and a head the loop calls separately, and a scale parameter used by the loop
    itself: the modules' parameters by their rules, the bare one by the global path; all exact."""
    calls = _global_path_calls(monkeypatch)
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(4, 5), nn.Tanh()).double()
    head = _Head().double()
    scale = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))
    params = [*encoder.parameters(), *head.parameters(), scale]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g)
    cp = Cockpit(params, [quantities.GradVariance()], diagnose=False, strict=True)

    def contributions():
        return nn.functional.cross_entropy(scale * head(encoder(x)), y, reduction="none") / x.shape[0]

    loss = nn.functional.cross_entropy(scale * head(encoder(x)), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert calls == [1]  # only the scale
    assert isinstance(cp.engine.model, nn.ModuleList) and list(cp.engine.model) == [encoder, head]
    per_sample = contributions()
    expected = []
    for p in params:
        rows = [6 * torch.autograd.grad(per_sample[n], p, retain_graph=True)[0] for n in range(6)]
        expected.append(torch.stack(rows).reshape(6, -1).var(0, unbiased=True).sum())
    problems.assert_close(cp.get_output()[0]["GradVariance"], expected, what="GradVariance, two roots and a bare parameter")


@pytest.mark.parametrize("container", [nn.ModuleDict, nn.ModuleList], ids=["ModuleDict", "ModuleList"])
def test_a_container_given_as_the_model_whose_parts_the_loop_calls(container, monkeypatch):
    """``Cockpit(nn.ModuleDict({"encoder": ..., "head": ...}))`` with the parts called by the loop: the
    container itself never runs, so the batch size was not known and every parameter took the global path
    at every step (B backward passes); now its called parts stand for it, as for a Cockpit given their
    parameters. A validation pass with gradients on is not part of the step."""
    calls = _global_path_calls(monkeypatch)
    torch.manual_seed(0)
    encoder, head = nn.Sequential(nn.Linear(4, 5), nn.Tanh()), _Head()
    parts = (container({"encoder": encoder, "head": head}) if container is nn.ModuleDict
             else container([encoder, head])).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g)
    cp = Cockpit(parts, [quantities.GradVariance()], diagnose=False, strict=True)

    def forward(inputs):
        return head(encoder(inputs))

    forward(torch.randn(2, 4, dtype=torch.float64))  # validation, gradients on
    loss = nn.functional.cross_entropy(forward(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert calls == []
    per_sample = nn.functional.cross_entropy(forward(x), y, reduction="none") / 6
    expected = []
    for p in parts.parameters():
        rows = [6 * torch.autograd.grad(per_sample[n], p, retain_graph=True)[0] for n in range(6)]
        expected.append(torch.stack(rows).reshape(6, -1).var(0, unbiased=True).sum())
    problems.assert_close(cp.get_output()[0]["GradVariance"], expected, what="GradVariance, a container's parts")


def test_a_validation_pass_before_the_first_step_does_not_become_the_model():
    """Only the calls the step's loss depends on count when the modules are found."""
    problem = problems.make("mlp", 4, steps=1)
    other = nn.Sequential(nn.Linear(6, 3)).double()
    cp = Cockpit(list(problem.model.parameters()) + list(other.parameters()), [quantities.NormTest()], diagnose=False)
    x, y = problem.batches[0]
    other(x).sum()  # a forward pass this step's loss does not depend on
    loss = problem.lossfunc(problem.model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert cp.engine.model is problem.model
    assert math.isfinite(cp.get_output()[0]["NormTest"])


def test_business_on_an_extended_model_is_equal_in_both_recipes():
    """Cockpit's business recipe on the extended plain models: first order and exact curvature alike."""
    for name in ("mlp", "cnn", "mse"):
        records = []
        for params_only in (False, True):
            problem = problems.make(name, 3, steps=2)
            cp, _ = problems.run(problem, configuration("business"), params_only=params_only)
            records.append(cp.get_output())
        for step in records[0]:
            assert records[1][step]["meta"]["HessTrace"]["curvature"] == "diag_h"
            for key in ("HessTrace", "TICDiag", "NormTest", "InnerTest", "OrthoTest", "Alpha"):
                if key in records[0][step]:
                    problems.assert_close(records[1][step][key], records[0][step][key], rtol=1e-10, what=f"{key}, {name}")


def test_an_extended_token_model_with_a_flattened_loss_is_exact():
    """``extend(model)``, ``extend(nn.CrossEntropyLoss())`` on ``[B·T, V]`` logits and the named
    parameters, no ``batch_size``: each sample is a sequence (its mean token loss), as the brute
    force of per-sequence gradients says (this recipe once took the B·T rows for samples)."""
    from cockpit_lite import extend
    from models import GPT, SEQ, VOCAB

    torch.manual_seed(0)
    model, b = GPT().double(), 4
    x, y = torch.randint(0, VOCAB, (b, SEQ)), torch.randint(0, VOCAB, (b, SEQ))
    params = list(model.parameters())
    per_sequence = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1), reduction="none")
    per_sequence = per_sequence.reshape(b, SEQ).mean(1)
    rows = torch.stack([
        torch.cat([g.reshape(-1) for g in torch.autograd.grad(per_sequence[n], params, retain_graph=True)])
        for n in range(b)
    ])
    sizes = [p.numel() for p in params]
    expected = [part.var(0, unbiased=True).sum() for part in rows.split(sizes, dim=1)]

    model = extend(model)
    cp = Cockpit(model.named_parameters(), [quantities.GradVariance()], diagnose=False)
    loss = extend(nn.CrossEntropyLoss())(model(x).reshape(-1, VOCAB), y.reshape(-1))
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert not cp.get_output()[0].get("flags")
    problems.assert_close(cp.get_output()[0]["GradVariance"], expected, what="GradVariance, extended token model")


def test_the_diagnosis_signals_watch_the_found_model():
    """Given parameters only, the forward-hook signals (activations, inputs, the origin of a NaN)
    watch the model once the engine found it: raw 0..255-scale inputs and a dead ReLU layer are
    found as with ``Cockpit(model)``, and a loop calling two modules in turn is watched whole."""
    torch.manual_seed(0)
    body, head = nn.Sequential(nn.Linear(6, 16), nn.ReLU()), nn.Linear(16, 3)
    with torch.no_grad():
        body[0].bias.fill_(-1e3)  # every unit dead
    cp = Cockpit(list(body.parameters()) + list(head.parameters()))
    opt = torch.optim.SGD(cp.params, lr=0.01)
    x, y = 100 * torch.rand(32, 6), torch.randint(0, 3, (32,))
    for step in range(8):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(head(body(x)), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    cp.close()
    assert isinstance(cp.engine.model, nn.ModuleList)
    stats = next(e["ActivationStats"] for s, e in sorted(cp.output.items()) if "ActivationStats" in e)
    assert stats["0.1"]["dead"] == 1.0
    kinds = {f.kind for f in cp.findings}
    assert {"unnormalized_inputs", "dead_relu"} <= kinds, cp.findings
    assert not any(h for q in cp.quantities for h in getattr(q, "_handles", []))  # unwatched at close
