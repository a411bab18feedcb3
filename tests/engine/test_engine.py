"""The engine on realistic set-ups: the exact global path, accumulation, mixed precision,
observer effect, and every refusal's advice applied."""

import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import models
import problems
from test_rules import _global_path_uses
from cockpit_lite import Cockpit, configuration, quantities, subsample


def norm_test(individual):
    """sqrt(Σ_n ‖g̃_n − g‖² / ((B−1) B ‖g‖²)) of individual gradients ``[B, D]``."""
    b, g = individual.shape[0], individual.mean(0)
    return torch.sqrt(((individual - g) ** 2).sum() / ((b - 1) * b * (g**2).sum()))


def norm_test_reference(problem, snapshots, step):
    """``norm_test`` over all parameters, and per parameter."""
    flat = [g.reshape(g.shape[0], -1) for g in problems.individual_gradients(problem, snapshots[step])]
    return norm_test(torch.cat(flat, 1)), [norm_test(f) for f in flat]


def grad_variance_reference(problem, snapshots, step):
    """Per parameter, the trace of the unbiased covariance of the individual gradients."""
    return [g.reshape(g.shape[0], -1).var(0, unbiased=True).sum() for g in problems.individual_gradients(problem, snapshots[step])]


@pytest.mark.parametrize("name", ["gpt", "resnet_bn_train", "lstm", "mlp"])
def test_parameters_without_their_model_give_the_exact_numbers(name):
    """``Cockpit(model.parameters())`` (Cockpit's style): exact against the brute force (tests/engine/test_discovery.py checks the route)."""
    problem = problems.make(name, 4, steps=2)
    cp, snapshots = problems.run(problem, [quantities.NormTest(), quantities.GradVariance()], params_only=True)
    for step in snapshots:
        value, layers = norm_test_reference(problem, snapshots, step)
        problems.assert_close(cp.get_output()[step]["NormTest"], value, what=f"NormTest params-only {name}")
        problems.assert_close(cp.get_output()[step]["GradVariance"], grad_variance_reference(problem, snapshots, step))


def _micro_batch_run(problem, quantity_list, params_only=False):
    """Two micro-batches per optimizer step; the Cockpit around the second backward pass
    (``params_only``: given the parameters without their model, the global path)."""
    params = list(problem.model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    cp = Cockpit(params if params_only else problem.model, quantity_list, strict=True)
    snapshots = {}
    for step, (x, y) in enumerate(problem.batches):
        opt.zero_grad()
        half = x.shape[0] // 2
        problem.lossfunc(problem.model(x[:half]), y[:half]).backward()
        state = {k: v.clone() for k, v in problem.model.state_dict().items()}
        snapshots[step] = problems.Snapshot([p.detach().clone() for p in params], x[half:], y[half:], state, torch.get_rng_state())
        loss = problem.lossfunc(problem.model(x[half:]), y[half:])
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    return cp, snapshots


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_gradient_accumulation_describes_the_micro_batch(name):
    """With ``cp(step)`` around the last micro-batch only (``accumulate=False``) every quantity is of
    that backward pass's micro-batch (never a mix), and a warning names the fix that measures the
    effective batch (``tests/engine/test_window.py`` tests it)."""
    problem = problems.make(name, 8, steps=2)
    with pytest.warns(UserWarning, match=r"Cockpit\(\.\.\., accumulate=True\) with `with cp\(step, \.\.\.\)` around every"):
        cp, snapshots = _micro_batch_run(problem, [quantities.NormTest(), quantities.GradNorm(), quantities.GradVariance()])
    for step, snapshot in snapshots.items():
        entry = cp.get_output()[step]
        assert entry["batch"] == {"size": 4, "accumulated": True, "passes": 1}
        value, _ = norm_test_reference(problem, snapshots, step)
        problems.assert_close(entry["NormTest"], value, what="NormTest accumulation")
        problems.assert_close(entry["GradVariance"], grad_variance_reference(problem, snapshots, step))
        grads = problems.gradient(problem, snapshot)
        problems.assert_close(entry["GradNorm"], [g.norm() for g in grads])


@pytest.mark.parametrize("name, params_only", [("mlp", False), ("mlp", True), ("gpt", False)],
                         ids=["rules", "global_path", "tied_weights"])
def test_alpha_under_accumulation_predicts_the_accumulated_update(name, params_only):
    problem = problems.make(name, 8, steps=3)
    cp, _ = _micro_batch_run(problem, [quantities.Alpha()], params_only)
    flags = [f for entry in cp.get_output().values() for f in entry.get("flags", [])]
    assert not flags and all(math.isfinite(e["Alpha"]) for e in cp.get_output().values() if "Alpha" in e)


class TiedFunctionally(nn.Module):
    """Uses ``lin.weight`` through its own module and, a second time, in its own code."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        return self.head(F.linear(h, self.lin.weight))


class UncalledHolder(nn.Module):
    """T5's layout in small: ``shared`` holds a weight but is never called; ``first`` and ``second``
    (T5's encoder and decoder ``embed_tokens``) hold the same weight and are called. ``read``: the
    model's own code reads the holder's weight as well."""

    def __init__(self, read=False):
        super().__init__()
        self.read = read
        self.shared = nn.Linear(4, 4, bias=False)
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4, bias=False)
        self.first.weight = self.second.weight = self.shared.weight
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = self.second(torch.tanh(self.first(x)))
        if self.read:
            h = h + F.linear(x, self.shared.weight)
        return self.head(torch.tanh(h))


def test_a_tied_weight_whose_holder_is_never_called_is_served_where_its_other_holders_are(monkeypatch):
    """Before, the uncalled holder's use was looked for in its parent's call (the whole model's own
    code), which sent T5's shared embedding to the global path, B backward passes at every step."""
    from test_rules import assert_matches_autograd

    torch.manual_seed(0)
    assert_matches_autograd(UncalledHolder().double(), torch.randn(5, 4, dtype=torch.float64), monkeypatch)


def test_a_read_of_an_uncalled_holders_weight_by_the_models_code_is_caught_then_served_by_the_global_path():
    torch.manual_seed(0)
    _flagged_then_global(UncalledHolder(read=True).double(), "shared.weight", 0, "used somewhere the engine did not see",
                         "GradVariance missed read of a holder", finite=(1, 2, 3))


def _flagged_then_global(model, name, index, caught_text, what, finite=(), extra=()):
    """Two steps of GradVariance (and the quantities ``extra``): at the first, parameter ``name``
    (record index ``index``) is NaN with a flag and a warning naming ``caught_text`` and the
    parameters ``finite`` keep their values; at the second, every parameter has the exact value
    (autograd on the individual losses), the failed one by the global path."""
    cp = Cockpit(model, [quantities.GradVariance(), *extra], diagnose=False)
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    for step in range(2):
        model.zero_grad()
        loss = F.cross_entropy(model(x), y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cp(step, info={"loss": loss}):
                loss.backward()
        entry = cp.get_output()[step]
        if step == 0:
            assert any(caught_text in str(w.message) for w in caught)
            assert math.isnan(entry["GradVariance"][index]) and any(name in f for f in entry["flags"])
            assert all(math.isfinite(entry["GradVariance"][i]) for i in finite)
        else:  # every parameter exact (the failed one by the global path, the others by their rules)
            assert "flags" not in entry
            contributions = F.cross_entropy(model(x), y, reduction="none") / 5
            for i, p in enumerate(model.parameters()):
                g = torch.stack([torch.autograd.grad(c, p, retain_graph=True)[0] * 5 for c in contributions])
                problems.assert_close(entry["GradVariance"][i], g.var(0, unbiased=True).sum(), what=what)


def test_a_use_the_capture_missed_is_caught_then_served_by_the_global_path():
    torch.manual_seed(0)
    model = TiedFunctionally().double()
    _flagged_then_global(model, "lin.weight", 0, "global path", "GradVariance missed use")


def test_a_layer_rule_that_fails_inside_backward_is_flagged_then_served_by_the_global_path(monkeypatch):
    """An unexpected error in a rule (here: LayerNorm's) must not stop the user's training."""
    from cockpit_lite.engine.rules.norm import LayerNormRule

    def broken(self, call, tracked, batch_size):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(LayerNormRule, "per_sample", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3)).double()
    _flagged_then_global(model, "1.weight", 2, "planted failure", "GradVariance after a failed rule",
                         finite=(0, 1, 4, 5))


def plant_failure_once(monkeypatch, cls, method, param=None):
    """``cls.method`` (a transform's ``__call__`` or ``batch``) raises "planted failure" the first time it
    is given the individual gradients of ``param`` (of any parameter: ``None``), then works."""
    original, planted = getattr(cls, method), []

    def failing(self, per_samples):
        given = per_samples if isinstance(per_samples, list) else [per_samples]
        if not planted and (param is None or any(p.param is param for p in given)):
            planted.append(True)
            raise RuntimeError("planted failure")
        return original(self, per_samples)

    monkeypatch.setattr(cls, method, failing)


def test_a_transform_that_fails_on_a_rules_output_is_flagged_then_served_by_the_global_path(monkeypatch):
    """A transform that raises on the individual gradients a rule gave (e.g. of a form it did not
    foresee) inside the user's backward pass: NaN and a flag, never a crash."""
    from cockpit_lite.engine.transforms import SumGradSquared

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    plant_failure_once(monkeypatch, SumGradSquared, "__call__", model[2].weight)
    _flagged_then_global(model, "2.weight", 2, "planted failure", "GradVariance after a failed transform",
                         finite=(0, 1, 3))


def test_a_batch_of_small_parameters_whose_transform_fails_is_flagged_then_served_by_the_global_path(monkeypatch):
    """The histogram of the small parameters is computed for all of them at once after the
    backward pass (``Batch.flush``): its failure makes each of them NaN with a flag."""
    from cockpit_lite.engine.transforms import GradHistogram1d

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    plant_failure_once(monkeypatch, GradHistogram1d, "batch")
    _flagged_then_global(model, "0.weight", 0, "planted failure", "GradVariance after a failed batch",
                         extra=[quantities.GradHist1d()])


def test_a_rule_whose_gradient_has_another_shape_is_flagged_then_served_by_the_global_path(monkeypatch):
    """A rule that gives a bias one output too few (a rule bug of the kind a new layer type brings):
    the check against autograd names the shapes; the values are NaN, never a crash."""
    from cockpit_lite.engine.per_sample import PerSample
    from cockpit_lite.engine.rules.linear import LinearRule

    original = LinearRule.per_sample

    def short(self, call, tracked, batch_size):
        out = original(self, call, tracked, batch_size)
        if "bias" in out and call.module.out_features == 3:
            part = out["bias"]
            out["bias"] = PerSample(part.param, part.index, grad_batch=part.grad_batch[:, :-1])
        return out

    monkeypatch.setattr(LinearRule, "per_sample", short)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False)  # (its transforms keep the short shape)
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    for step in range(2):
        model.zero_grad()
        loss = F.cross_entropy(model(x), y)
        with pytest.warns(UserWarning, match=r"tensor of shape \(2,\), autograd's gradient to \(3,\)") if not step \
                else warnings.catch_warnings():
            with cp(step, info={"loss": loss}):
                loss.backward()
    first, second = cp.get_output()[0], cp.get_output()[1]
    layers = first["layers"]["NormTest"]
    assert math.isnan(layers[3]) and all(math.isfinite(v) for v in layers[:3])
    assert any("2.bias unavailable" in f for f in first["flags"])
    assert "flags" not in second and all(math.isfinite(v) for v in second["layers"]["NormTest"])


def test_observer_effect_on_realistic_models_is_zero():
    """Economy at every step leaves the training bit-identical (dropout models included)."""
    for name in models.REALISTIC:
        results = []
        for tracked in (False, True):
            problem = problems.make(name, 4, steps=3)
            torch.manual_seed(5)
            if tracked:
                problems.run(problem, configuration("economy", extras=True))
            else:
                opt = torch.optim.SGD(problem.model.parameters(), lr=0.1)
                for x, y in problem.batches:
                    opt.zero_grad()
                    problem.lossfunc(problem.model(x), y).backward()
                    opt.step()
            results.append([p.detach().clone() for p in problem.model.state_dict().values()])
        assert all(torch.equal(a, b) for a, b in zip(*results)), name


def test_bf16_autocast_matches_brute_force_under_autocast():
    """Statistics of the gradients autograd computes under bf16 autocast, against a loop of
    autograd.grad over the samples of the same autocast forward pass. The engine reads a
    Linear layer's input in float32 where autograd's weight gradient uses its bf16 cast
    (8 significant bits, relative spacing 2^-8 ≈ 0.4%); squared, twice that, so 2%."""
    for build, shape in ((lambda: models.Encoder(0.0), (6, models.SEQ, 3)), (lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)), (6, 6))):
        torch.manual_seed(0)
        model = build()
        cp = Cockpit(model, [quantities.GradVariance()], strict=True)
        x, y = torch.randn(*shape, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0, 1, 2])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        with cp(0, info={"loss": loss}):
            loss.backward()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            contributions = F.cross_entropy(model(x), y, reduction="none") / 6
        params = list(model.parameters())
        individual = [torch.autograd.grad(c * 6, params, retain_graph=True) for c in contributions]
        expected = [torch.stack(g).double().reshape(6, -1).var(0).sum() for g in zip(*individual)]
        torch.testing.assert_close(torch.tensor(cp.get_output()[0]["GradVariance"], dtype=torch.float64), torch.stack(expected), rtol=2e-2, atol=1e-7)


def test_bf16_model_statistics_in_float32():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3)).to(torch.bfloat16)
    cp = Cockpit(model, [quantities.GradVariance(), quantities.NormTest()], strict=True)
    loss = F.cross_entropy(model(torch.randn(5, 6, dtype=torch.bfloat16)), torch.tensor([0, 1, 2, 0, 1]))
    with cp(0, info={"loss": loss}):
        loss.backward()
    entry = cp.get_output()[0]
    assert math.isfinite(entry["NormTest"]) and all(math.isfinite(v) and v > 0 for v in entry["GradVariance"])


def test_compiled_model_is_refused_with_a_fix_that_works():
    model = nn.Sequential(nn.Linear(4, 3))
    compiled = torch.compile(model)
    with pytest.raises(ValueError, match=r"Cockpit\(model, \.\.\.\)") as error:
        Cockpit(compiled, [quantities.NormTest()])
    assert "uncompiled" in str(error.value)
    cp = Cockpit(model, [quantities.NormTest()])  # the fix: the original module, run uncompiled when tracked
    loss = F.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 2]))
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert math.isfinite(cp.get_output()[0]["NormTest"])


class BatchMixingLoss(nn.Module):
    """A hand-written loss: cross-entropy written out, not a torch loss function."""

    def forward(self, logits, y):
        return -(logits.log_softmax(1).gather(1, y[:, None])).mean()


def test_global_path_without_derivable_losses_names_the_fix_and_the_fix_works():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    cp = Cockpit(model, [quantities.NormTest()])
    loss = BatchMixingLoss()(model(x), y)
    with pytest.raises(ValueError, match=r"individual_losses.*reduction='none'"):
        with cp(0, info={"loss": loss}):
            loss.backward()
    model.zero_grad()
    out = model(x)
    losses = -(out.log_softmax(1).gather(1, y[:, None]))[:, 0]  # the fix: per-sample losses with their graph
    loss = losses.mean()
    with cp(1, info={"loss": loss, "individual_losses": losses}):
        loss.backward()
    assert math.isfinite(cp.get_output()[1]["NormTest"])


def test_unobserved_forward_warns_and_still_gives_exact_numbers():
    """Step numbers that jump past the prepared step: the global path, with a warning."""
    problem = problems.make("mlp", 4, steps=2)
    cp = Cockpit(problem.model, [quantities.NormTest(track_schedule=lambda s: s in (0, 5))], strict=True)
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.1)
    snapshots = {}
    for step, (x, y) in zip((0, 5), problem.batches):
        snapshots[step] = problems.Snapshot([p.detach().clone() for p in problem.model.parameters()], x, y)
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
        assert (step == 5) == any("did not see this step's forward pass" in str(w.message) for w in caught)
        opt.step()
    value, _ = norm_test_reference(problem, snapshots, 5)
    problems.assert_close(cp.get_output()[5]["NormTest"], value, what="NormTest unobserved")


def test_a_shared_tensor_as_long_as_the_batch_is_not_taken_for_a_batched_one():
    """Positions ``pos(arange(T))`` with ``T = B``: its axis of size B is not the batch axis."""
    problem = problems.make("vit_like", models.SEQ + 1, steps=2)
    cp, snapshots = problems.run(problem, [quantities.NormTest()])
    for step in snapshots:
        value, layers = norm_test_reference(problem, snapshots, step)
        problems.assert_close(cp.get_output()[step]["layers"]["NormTest"], layers, what="NormTest T=B")


class SeqFirstRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(3, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[-1])


def test_a_backpack_extended_sequence_first_rnn_gives_the_same_numbers():
    """BackPACK's wrapped outputs may hand the engine's gradient hooks ``None``."""
    from cockpit_lite import extend

    values = []
    for extended in (False, True):
        torch.manual_seed(0)
        model = SeqFirstRNN().double()
        model = extend(model) if extended else model
        cp = Cockpit(model, [quantities.NormTest(), quantities.GradVariance()], strict=True, diagnose=False)
        x = torch.randn(5, 6, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        loss = F.cross_entropy(model(x), torch.tensor([0, 1, 0, 1, 1, 0]))
        with cp(0, info={"loss": loss, "batch_size": 6}):
            loss.backward()
        values.append(cp.get_output()[0])
    assert values[1]["NormTest"] == pytest.approx(values[0]["NormTest"], rel=1e-12)
    assert values[1]["GradVariance"] == pytest.approx(values[0]["GradVariance"], rel=1e-12)


def _broken_layer_norm(monkeypatch, fail_calls):
    """Make LayerNorm's rule raise at the calls numbered ``fail_calls`` (from 0), else run it."""
    from cockpit_lite.engine.rules.norm import LayerNormRule

    original, calls = LayerNormRule.per_sample, []

    def broken(self, call, tracked, batch_size):
        calls.append(call)
        if len(calls) - 1 in fail_calls:
            raise RuntimeError("planted failure")
        return original(self, call, tracked, batch_size)

    monkeypatch.setattr(LayerNormRule, "per_sample", broken)


@pytest.mark.parametrize("failing", [0, 1])  # at step 1, α's end of step 0 is due too
def test_a_failed_rule_gives_nan_to_every_first_order_quantity_and_only_its_own_flags(failing, monkeypatch):
    """Both LayerNorm parameters fail: one warning and one flag each, NaN in every statistic
    that involves them (histogram counts included), no quantity failing because of it, and
    finite values at the other steps (the global path from the next one on)."""
    _broken_layer_norm(monkeypatch, fail_calls={failing})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3)).double()
    names = ["GradVariance", "GradHist1d", "GradHist2d", "NormTest", "InnerTest", "OrthoTest", "MeanGSNR", "Alpha"]
    cp = Cockpit(model, [getattr(quantities, n)() for n in names], diagnose=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    for step in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
        opt.step()
        entry = cp.get_output()[step]
        if step == failing:
            assert sorted(str(w.message).split(" could not")[0] for w in caught) == [
                "cockpit-lite: individual gradients of 1.bias", "cockpit-lite: individual gradients of 1.weight"]
            assert sorted(entry["flags"]) == [
                "individual gradients of 1.bias unavailable at this step: 1: RuntimeError: planted failure",
                "individual gradients of 1.weight unavailable at this step: 1: RuntimeError: planted failure"]
            values = entry["GradVariance"]
            assert [math.isnan(v) for v in values] == [False, False, True, True, False, False]
            for name in ("NormTest", "InnerTest", "OrthoTest", "MeanGSNR"):
                assert math.isnan(entry[name]), name
            for name in ("GradHist1d", "GradHist2d"):
                assert torch.isnan(torch.as_tensor(entry[name]["hist"])).all(), name
        else:
            assert not caught and "flags" not in entry
            assert all(math.isfinite(v) for v in entry["GradVariance"])
    assert [math.isnan(cp.get_output()[step]["Alpha"]) for step in (0, 1)] == [True, failing == 1]


@pytest.mark.parametrize("failing", [0, 1])  # the rules run in backward order: the outer call first
def test_a_parameter_one_of_whose_uses_fails_is_flagged_once(failing, monkeypatch):
    """A LayerNorm called twice: one call's rule fails, the other succeeds; the parameter's
    values are NaN with one flag (the rules' sum, short of a use, is not checked again), and
    the other parameters used twice (the Linear layer) keep exact values."""
    _broken_layer_norm(monkeypatch, fail_calls={failing})

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm, self.head = nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 3)

        def forward(self, x):
            return self.head(self.norm(torch.tanh(self.lin(self.norm(self.lin(x))))))

    torch.manual_seed(0)
    model = Twice().double()
    cp = Cockpit(model, [quantities.GradVariance()], diagnose=False)
    x, y = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    loss = F.cross_entropy(model(x), y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cp(0, info={"loss": loss}):
            loss.backward()
    entry = cp.get_output()[0]
    assert [math.isnan(v) for v in entry["GradVariance"]] == [False, False, True, True, False, False]
    contributions = F.cross_entropy(model(x), y, reduction="none") / 5
    for i in (0, 1, 4, 5):
        p = list(model.parameters())[i]
        g = torch.stack([torch.autograd.grad(c, p, retain_graph=True)[0] * 5 for c in contributions])
        problems.assert_close(entry["GradVariance"][i], g.var(0, unbiased=True).sum(), what="GradVariance, a use failed")
    assert sorted(f.split(" unavailable")[0] for f in entry["flags"]) == [
        "individual gradients of norm.bias", "individual gradients of norm.weight"]


def test_a_rule_giving_the_wrong_number_of_samples_is_flagged_then_served_by_the_global_path(monkeypatch):
    from cockpit_lite.engine.rules.norm import LayerNormRule

    original = LayerNormRule.per_sample

    def short(self, call, tracked, batch_size):
        out = original(self, call, tracked, batch_size)
        for part in out.values():
            part.grad_batch = part.grad_batch[1:]
        return out

    monkeypatch.setattr(LayerNormRule, "per_sample", short)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3)).double()
    _flagged_then_global(model, "1.weight", 2, "gave 4 individual gradients for a batch of 5",
                         "GradVariance after a wrong sample count", finite=(0, 1, 4, 5))


def test_a_container_whose_members_the_loop_calls_directly():
    """``Cockpit(ModuleDict)`` whose members are called one by one (the container itself never
    runs), one member unused at this step: exact values, zeros for the unused member."""
    torch.manual_seed(0)
    parts = nn.ModuleDict({"enc": nn.Linear(3, 4), "head": nn.Linear(4, 2), "aux": nn.Linear(4, 1)}).double()
    cp = Cockpit(parts, [quantities.GradVariance()], diagnose=False)
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1])
    forward = lambda: parts["head"](torch.tanh(parts["enc"](x)))  # noqa: E731
    loss = F.cross_entropy(forward(), y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cp(0, info={"loss": loss}):
            loss.backward()
    contributions = F.cross_entropy(forward(), y, reduction="none") / 5
    for value, p in zip(cp.get_output()[0]["GradVariance"], parts.parameters()):
        g = [torch.autograd.grad(c, p, retain_graph=True, allow_unused=True)[0] for c in contributions]
        g = torch.stack([torch.zeros_like(p) if gn is None else gn * 5 for gn in g])
        problems.assert_close(value, g.var(0, unbiased=True).sum(), what="GradVariance, members called directly")


def _grad_variance_of(model, x, loss_of, samples):
    """GradVariance from a Cockpit without ``info["batch_size"]`` or derivable individual
    losses (the batch size comes from the model's input), and the brute force over ``samples``
    (per sample n: the loss of the forward pass restricted to sample n, times B)."""
    cp = Cockpit(model, [quantities.GradVariance()], diagnose=False, strict=True)
    loss = loss_of(model(x))
    with cp(0, info={"loss": loss}):
        loss.backward()
    expected = []
    for p in model.parameters():
        g = torch.stack([torch.autograd.grad(loss_of(model(x), n), p)[0] for n in range(samples)])
        expected.append(g.var(0, unbiased=True).sum())
    return cp.get_output()[0]["GradVariance"], expected


def test_the_batch_size_is_read_from_a_one_dimensional_input():
    """Token ids ``[B]`` and a loss the engine cannot split per sample."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(7, 3), nn.Linear(3, 2)).double()
    ids = torch.tensor([1, 4, 4, 0, 6])

    def loss_of(out, n=None):  # Σ out² / B; for sample n: B · its term
        return (out**2).sum() / 5 if n is None else (out[n] ** 2).sum()

    got, expected = _grad_variance_of(model, ids, loss_of, 5)
    problems.assert_close(got, expected, what="GradVariance, 1-d input")


def test_the_batch_axis_of_a_bare_sequence_first_recurrent_model_is_its_second():
    torch.manual_seed(0)
    model = nn.GRU(3, 4).double()  # batch_first=False: inputs [T, B, F]
    x = torch.randn(6, 5, 3, dtype=torch.float64)

    def loss_of(out, n=None):
        out = out[0]
        return (out**2).sum() / 5 if n is None else (out[:, n] ** 2).sum()

    got, expected = _grad_variance_of(model, x, loss_of, 5)
    problems.assert_close(got, expected, what="GradVariance, sequence-first GRU")


class WordLM(nn.Module):
    """PyTorch's word language model: ``[T, B]`` token ids, an embedding, a sequence-first LSTM or
    transformer encoder (their default layout), the decoder's logits flattened time-major for the loss
    (``output.view(-1, V)``)."""

    def __init__(self, body, vocab=9):
        super().__init__()
        self.emb, self.dec = nn.Embedding(vocab, 4), nn.Linear(4, vocab)
        self.body = nn.LSTM(4, 4) if body == "lstm" else nn.TransformerEncoder(
            nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0), 1, enable_nested_tensor=False)

    def forward(self, ids):
        out = self.body(self.emb(ids))
        return self.dec(out[0] if isinstance(out, tuple) else out)


@pytest.mark.parametrize("body", ["lstm", "transformer"])
def test_the_batch_axis_of_a_word_language_model_is_its_sequence_first_body_s(body):
    """Without ``info["batch_size"]``, B was read as T from the ``[T, B]`` input (6 "samples" along the
    time axis, silently); the derived losses grouped the time-major rows as if batch-major. Both now
    follow the sequence-first LSTM or attention: against the brute force of each sequence's summed
    token losses."""
    torch.manual_seed(0)
    model = WordLM(body).double()
    g = torch.Generator().manual_seed(1)
    ids, targets = torch.randint(0, 9, (6, 5), generator=g), torch.randint(0, 9, (6, 5), generator=g)
    cp = Cockpit(model, [quantities.GradVariance()], diagnose=False, strict=True)
    loss = nn.functional.cross_entropy(model(ids).view(-1, 9), targets.view(-1))
    with cp(0, info={"loss": loss}):
        loss.backward()
    terms = nn.functional.cross_entropy(model(ids).view(-1, 9), targets.view(-1), reduction="none").view(6, 5) / 30
    expected = []
    for p in model.parameters():
        g = torch.stack([5 * torch.autograd.grad(terms[:, n].sum(), p, retain_graph=True)[0] for n in range(5)])
        expected.append(g.var(0, unbiased=True).sum())
    problems.assert_close(cp.get_output()[0]["GradVariance"], expected, what="GradVariance, word LM")


class ReadAgain(nn.Module):
    """``lin.weight`` read again by the model's own code, scaled by ``scale``; ``upstream`` puts
    a Linear layer and a BatchNorm in training mode in front (that Linear takes the global path)."""

    def __init__(self, scale, upstream):
        super().__init__()
        self.scale = scale
        self.front = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)) if upstream else nn.Identity()
        self.lin, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        h = torch.tanh(self.lin(self.front(x)))
        return self.head(h + self.scale * F.linear(h, self.lin.weight))


@pytest.mark.parametrize("scale, upstream", [(1e-3, False), (1.0, True)], ids=["small_second_use", "with_global_path"])
def test_a_use_the_capture_missed_is_caught_when_small_or_beside_the_global_path(scale, upstream):
    """The check compares in float64 to 1e-6 (a second use worth 0.1% of the gradient is
    caught), and checks every parameter served by rules even when others took the global path."""
    torch.manual_seed(0)
    model = ReadAgain(scale, upstream).double()
    cp = Cockpit(model, [quantities.GradVariance()], diagnose=False)
    loss = F.cross_entropy(model(torch.randn(6, 4, dtype=torch.float64)), torch.tensor([0, 1, 2, 0, 1, 2]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cp(0, info={"loss": loss}):
            loss.backward()
    index = [name for name, _ in model.named_parameters()].index("lin.weight")
    assert math.isnan(cp.get_output()[0]["GradVariance"][index])
    assert any("lin.weight" in str(w.message) for w in caught)


def test_a_parameter_sent_to_the_global_path_without_individual_losses_is_nan_not_a_crash():
    """A use the capture missed sends ``lin.weight`` to the global path; with a loss whose
    individual losses cannot be derived (a custom one) that path cannot run. The next step is NaN
    for it with a flag naming the fix, instead of an error out of the user's loop; the fix
    (``info["individual_losses"]``) is exact against the brute force."""
    torch.manual_seed(0)
    model = ReadAgain(1.0, False).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [quantities.GradVariance()], diagnose=False)
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    index = [name for name, _ in model.named_parameters()].index("lin.weight")

    def terms():
        return (model(x) - y).abs().pow(1.5).sum(1)

    for step in range(3):
        opt.zero_grad()
        per = terms()
        loss = per.mean()
        info = {"loss": loss, "optimizer": opt, **({"individual_losses": per} if step == 2 else {})}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with cp(step, info=info):
                loss.backward()
        entry = cp.get_output()[step]
        if step < 2:
            assert math.isnan(entry["GradVariance"][index])
            assert step == 0 or any("individual_losses" in f for f in entry["flags"])
        else:
            assert "flags" not in entry
            expected = [torch.stack([6 * torch.autograd.grad(terms()[n] / 6, p)[0] for n in range(6)]).var(0).sum()
                        for p in model.parameters()]
            problems.assert_close(entry["GradVariance"], expected, what="GradVariance, the global path's fix")
        opt.step()


@pytest.mark.parametrize("params_only", [False, True])
def test_a_validation_pass_with_gradients_on_is_not_a_use(params_only):
    """``model.eval()`` without ``no_grad`` on a larger batch between training steps: only the
    calls the step's loss depends on count, so the next step is exact, not refused."""
    problem = problems.make("resnet_bn_train", 4, steps=3)
    model = problem.model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model.parameters() if params_only else model, [quantities.GradVariance()], diagnose=False, strict=True)
    for step, (x, y) in enumerate(problem.batches):
        model.train()
        snapshot = problems.Snapshot([p.detach().clone() for p in model.parameters()], x, y,
                                     {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state())
        opt.zero_grad()
        loss = problem.lossfunc(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
        expected = [g.reshape(4, -1).var(0, unbiased=True).sum() for g in problems.individual_gradients(problem, snapshot)]
        problems.assert_close(cp.get_output()[step]["GradVariance"], expected, what="GradVariance after a validation pass")
        model.eval()
        model(torch.randn(7, *x.shape[1:], dtype=x.dtype)).sum()  # validation, gradients on, 7 samples


class _KeyBiasAttention(nn.Module):
    """Attention whose key bias adds ``q·b_k`` to every score of a query, which softmax ignores:
    its gradient is zero in exact arithmetic (BERT's, DistilBERT's, HF ViT's key biases)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.head = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        attention = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / 2, -1)
        return self.head((attention @ self.v(x)).mean(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_exactly_zero_gradient_is_zero_not_a_failure(dtype):
    """Rounding noise in autograd's and the rules' sums of a zero gradient is not a missed use:
    the rules keep serving it, and the statistics match the brute force; the key bias's own values
    are NaN with a flag saying its gradient is zero up to rounding (tests/test_step.py)."""
    torch.manual_seed(0)
    model = _KeyBiasAttention().to(dtype)
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, strict=True)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 5, 3, generator=g, dtype=dtype), torch.randint(0, 2, (8,), generator=g)
    for step in range(2):
        model.zero_grad()
        loss = F.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
    assert cp.engine.force_global == set()
    assert all("of k.bias is zero up to rounding" in f for f in cp.get_output()[0].get("flags", [])), cp.get_output()[0]
    reference = model.double()
    per_sample = F.cross_entropy(reference(x.double()), y, reduction="none") / 8
    params = list(reference.parameters())
    rows = torch.stack([8 * torch.cat([p.reshape(-1) for p in torch.autograd.grad(per_sample[n], params, retain_graph=True)])
                        for n in range(8)])
    mean = rows.mean(0)
    expected = torch.sqrt(((rows - mean) ** 2).sum() / (7 * 8 * (mean**2).sum()))
    problems.assert_close(cp.get_output()[1]["NormTest"], expected, rtol=1e-4 if dtype == torch.float32 else 1e-10,
                          what="NormTest, an exactly zero gradient")


def test_backward_of_another_loss_than_info_loss_is_flagged_at_every_step_and_the_fix_works():
    """``(ce + λ·l2).backward()`` with ``info["loss"] = ce``: the individual gradients (of ce) are
    not the backward pass's (of ce + λ·l2), on the rules and on the global path alike: NaN and a
    flag at every step, never finite values that match nothing. On the global path, the loss
    backpropagated passed with each sample's share of it is exact against the brute force."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False)

    def terms():
        l2 = sum((p**2).sum() for p in model.parameters())
        return F.cross_entropy(model(x), y, reduction="none") + 1e-2 * l2  # ℓ_n, mean_n ℓ_n = ce + λ·l2

    for step in range(3):
        model.zero_grad()
        ce = F.cross_entropy(model(x), y)
        with pytest.warns(UserWarning) if step < 2 else warnings.catch_warnings():
            with cp(step, info={"loss": ce}):
                (ce + 1e-2 * sum((p**2).sum() for p in model.parameters())).backward()
        entry = cp.get_output()[step]
        assert math.isnan(entry["NormTest"]) and any("another loss" in f for f in entry["flags"]), step
    for step in range(3, 5):  # the fix
        model.zero_grad()
        losses = terms()
        total = losses.mean()
        with cp(step, info={"loss": total, "individual_losses": losses}):
            total.backward()
        assert "flags" not in cp.get_output()[step]
        shares = terms() / 8
        params = list(model.parameters())
        rows = torch.stack([8 * torch.cat([g.reshape(-1) for g in torch.autograd.grad(shares[n], params, retain_graph=True)])
                            for n in range(8)])
        mean = rows.mean(0)
        expected = torch.sqrt(((rows - mean) ** 2).sum() / (7 * 8 * (mean**2).sum()))
        problems.assert_close(cp.get_output()[step]["NormTest"], expected, what="NormTest, an explicit L2 term")


PENALTY_CAUSE = r"plus a term that reads no sample of the batch.*a penalty on the parameters, such as an explicit L2 term"
PENALTY_FIX = r"Fix: backpropagate the data loss inside the context and add the penalty's gradient outside it.*weight_decay"


def test_a_penalty_on_the_parameters_in_the_loss_is_named_and_the_fixes_it_names_are_exact():
    """``loss = ce + lam * sum ||p||^2`` backpropagated inside ``cp(step, info={"loss": loss})``: refused
    before backward (no per-sample losses to derive), or, with per-sample shares passed, NaN and a flag
    naming the penalty (the layer rules do not see its gradient). Both fixes it names, the data loss
    backpropagated inside the context and the penalty's gradient added outside it, or the optimizer's
    weight_decay, train as the penalised loss does and give the float64 brute force of the data loss."""
    lam, steps = 1e-2, 3
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g)

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()

    def penalty(model):
        return lam * sum(p.square().sum() for p in model.parameters())

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, configuration("economy"), diagnose=False)
    loss = F.cross_entropy(model(x), y) + penalty(model)
    with pytest.raises(ValueError, match=rf"Alpha needs info\['individual_losses'\].*{PENALTY_CAUSE}.*{PENALTY_FIX}"):
        cp(0, info={"loss": loss, "optimizer": opt})
    outputs = model(x)
    loss = F.cross_entropy(outputs, y) + penalty(model)
    shares = F.cross_entropy(outputs, y, reduction="none") + penalty(model)  # mean_n = the loss
    with pytest.warns(UserWarning, match=rf"could not be formed by a layer rule.*{PENALTY_CAUSE}.*{PENALTY_FIX}"):
        with cp(1, info={"loss": loss, "individual_losses": shares, "optimizer": opt}):
            loss.backward()
    entry = cp.get_output()[1]
    assert math.isnan(entry["NormTest"])
    assert any(re.search(PENALTY_CAUSE + ".*" + PENALTY_FIX, f) for f in entry["flags"])

    reference = mlp()  # the run the fixes must reproduce: the penalised loss, no Cockpit
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(steps):
        ref_opt.zero_grad()
        (F.cross_entropy(reference(x), y) + penalty(reference)).backward()
        ref_opt.step()
    for route in ("outside", "by weight_decay"):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=2 * lam if route == "by weight_decay" else 0.0)
        cp = Cockpit(model, configuration("economy"), diagnose=False)
        params = list(model.parameters())
        for step in range(steps):
            opt.zero_grad()
            data_loss = F.cross_entropy(model(x), y)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with cp(step, info={"loss": data_loss, "optimizer": opt}):
                    data_loss.backward()
            if route == "outside":
                penalty(model).backward()
            per_sample = F.cross_entropy(model(x), y, reduction="none")
            rows = [[gr.reshape(-1) for gr in torch.autograd.grad(per_sample[n], params, retain_graph=True)]
                    for n in range(8)]  # [sample][layer]: g_n = B grad(c_n) = grad(ce_n)
            blocks = [torch.stack([rows[n][i] for n in range(8)]) for i in range(len(params))]
            opt.step()
            entry = cp.get_output()[step]
            assert "flags" not in entry, (route, step, entry.get("flags"))
            expected_norms = [block.mean(0).norm() for block in blocks]
            problems.assert_close(entry["GradNorm"], expected_norms, what=f"GradNorm, a penalty added {route}")
            full = torch.cat(blocks, 1)
            mean = full.mean(0)
            expected = torch.sqrt(((full - mean) ** 2).sum() / (7 * 8 * (mean**2).sum()))
            problems.assert_close(entry["NormTest"], expected, what=f"NormTest, a penalty added {route}")
            projections = full @ mean
            expected = torch.sqrt(projections.var(unbiased=True) / (8 * (mean @ mean) ** 2))
            problems.assert_close(entry["InnerTest"], expected, what=f"InnerTest, a penalty added {route}")
            problems.assert_close(entry["Loss"], data_loss.detach(), what=f"Loss, a penalty added {route}")
        cp.close()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("samples", [None, 3])
def test_two_backward_passes_in_one_step_are_named_and_the_fix_works(samples):
    """``ce.backward(retain_graph=True); penalty.backward()`` inside one ``with cp(step)`` (two losses
    backpropagated one after the other): the rules see the first pass only. NaN and a flag that
    names the second pass at every step, never a switch to the global path (which could not
    follow the two passes either); the fix it names, one backward of the sum passed as
    info['loss'], is exact against the brute force."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, samples=samples)

    def terms(out):
        return F.cross_entropy(out, y, reduction="none") + 0.1 * (out**2).sum(1)  # ℓ_n of ce + penalty

    for step in range(2):
        model.zero_grad()
        out = model(x)
        ce, penalty = F.cross_entropy(out, y), 0.1 * (out**2).sum(1).mean()
        with pytest.warns(UserWarning) if step == 0 else warnings.catch_warnings():
            with cp(step, info={"loss": ce}):
                ce.backward(retain_graph=True)
                penalty.backward()
        entry = cp.get_output()[step]
        assert math.isnan(entry["NormTest"]) and entry["flags"]
        assert all("backward ran more than once" in f for f in entry["flags"]), step
        assert cp.engine.force_global == set()
    for step in range(2, 4):  # the fix
        model.zero_grad()
        out = model(x)
        total = F.cross_entropy(out, y) + 0.1 * (out**2).sum(1).mean()
        with cp(step, info={"loss": total, "individual_losses": terms(out)}):
            total.backward()
        entry = cp.get_output()[step]
        assert "flags" not in entry and math.isfinite(entry["NormTest"])
        if samples is not None:  # (the estimator against the brute force: tests/test_subsample.py)
            continue
        shares = terms(model(x)) / 8
        params = list(model.parameters())
        rows = torch.stack([8 * torch.cat([g.reshape(-1) for g in torch.autograd.grad(shares[n], params, retain_graph=True)])
                            for n in range(8)])
        mean = rows.mean(0)
        expected = torch.sqrt(((rows - mean) ** 2).sum() / (7 * 8 * (mean**2).sum()))
        problems.assert_close(entry["NormTest"], expected, what="NormTest, two losses summed")


@pytest.mark.parametrize("name", ["resnet_bn_train", "transformer", "gpt", "lstm"])
def test_two_backward_passes_are_named_on_every_route(name):
    """The global path (BatchNorm in training mode), attention, a tied head and an LSTM: every
    parameter's flag names the second backward pass, none is sent to the global path."""
    problem = problems.make(name, 7, steps=2)
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.1)
    cp = Cockpit(problem.model, [quantities.NormTest()], diagnose=False)
    for step, (x, y) in enumerate(problem.batches):
        opt.zero_grad()
        out = problem.model(x)
        loss, penalty = problem.lossfunc(out, y), 0.01 * out.pow(2).mean()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward(retain_graph=True)
                penalty.backward()
        opt.step()
        flags = cp.get_output()[step]["flags"]
        assert len(flags) == len(list(problem.model.parameters())), step
        assert all("backward ran more than once" in f for f in flags), step
        assert math.isnan(cp.get_output()[step]["NormTest"]) and cp.engine.force_global == set()


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "vit_like", "gpt"])
def test_a_subsampled_step_checks_the_rules_by_sketches_and_still_catches_another_loss(name, monkeypatch):
    """At a subsampled step the transforms take ``g`` from autograd and the rules never sum all
    samples' factored individual gradients; ``PerSample.check`` (a random sketch; a convolution's
    output channels; a tied embedding and head: the sum of its uses' sketches) checks them instead: an honest run has no flag, and ``(loss + λ·l2).backward()``
    with ``info["loss"] = loss`` is NaN with the flag at every step, as at an exact step."""
    from cockpit_lite.engine import per_sample as per_sample_module

    problem = problems.make(name, 8)
    checks, sums = [], []
    check, sample_sum = per_sample_module.PerSample.check, per_sample_module.PerSample.sample_sum

    def spy_check(self, generator):
        value, project = check(self, generator)
        checks.append(project is not None)
        return value, project

    def spy_sum(self):
        sums.append(self._factors is not None and self.num_samples == 8)
        return sample_sum(self)

    monkeypatch.setattr(per_sample_module.PerSample, "check", spy_check)
    monkeypatch.setattr(per_sample_module.PerSample, "sample_sum", spy_sum)
    cp, _ = problems.run(problem, [quantities.NormTest(), quantities.InnerTest()], samples=3)
    assert any(checks) and not any(sums), (checks, sums)
    for step, entry in cp.get_output().items():
        assert "flags" not in entry and math.isfinite(entry["NormTest"]), (step, entry)
    model, (x, y) = problem.model, problem.batches[0]
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False, samples=3)
    for step in range(2):
        model.zero_grad()
        loss = problem.lossfunc(model(x), y)
        with pytest.warns(UserWarning) if step == 0 else warnings.catch_warnings():
            with cp(step, info={"loss": loss}):
                (loss + 1e-2 * sum((p**2).sum() for p in model.parameters())).backward()
        entry = cp.get_output()[step]
        assert math.isnan(entry["NormTest"]) and any("another loss" in f for f in entry["flags"]), (step, entry)
        if step == 0:  # the sketched weights themselves (from step 1 on they take the global path)
            for weight in (n for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n):
                assert any(f"of {weight} unavailable" in f for f in entry["flags"]), (weight, entry["flags"])


def test_activations_are_not_kept_past_the_backward_pass():
    """The capture lets go of a call's inputs, outputs and output gradient once its rule ran (and of
    untracked calls' once the step is planned), so autograd frees activations during backward as it
    does without a Cockpit (a GPT-2-small-like model, batch 8, 3 steps: NormTest's peak growth 1214 -> 537 MiB,
    economy's 1647 -> 1106 MiB, the plain step's 301 MiB)."""
    import weakref

    torch.manual_seed(0)
    hidden = {}

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(4, 16), nn.Linear(16, 3)

        def forward(self, x):
            h = torch.relu(self.first(x))
            hidden["h"] = weakref.ref(h)
            return self.second(h)

    model = Model()
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False)
    for step in range(2):
        out = model(torch.randn(8, 4))
        logits = weakref.ref(out)
        loss = nn.functional.cross_entropy(out, torch.randint(0, 3, (8,)))
        del out
        with cp(step, info={"loss": loss}):
            loss.backward()
            assert hidden["h"]() is None and logits() is None  # inside the step, after backward
    assert math.isfinite(cp.get_output()[1]["NormTest"])


@pytest.mark.parametrize("name", ["mlp", "gpt", "resnet_bn_train"])
def test_a_finished_step_is_freed_without_the_cycle_collector(monkeypatch, name):
    """Nothing of a step's engine state outlives it in a reference cycle (its path callbacks held it:
    each parameter's gradient and the dense sums waited for Python's cycle collector; GPT-2-small-like
    model, GradVariance: peak growth over 6 steps 1540 -> 520 MiB, resident memory flat)."""
    import gc
    import weakref

    from cockpit_lite.engine.step import Step

    states = []
    original = Step.__init__

    def remember(self, *args, **kwargs):
        original(self, *args, **kwargs)
        states.append(weakref.ref(self))

    monkeypatch.setattr(Step, "__init__", remember)
    problem = problems.make(name, 4, steps=2)
    enabled = gc.isenabled()
    gc.disable()
    try:
        problems.run(problem, [quantities.GradVariance(), quantities.NormTest(), quantities.Alpha()])
        assert states and all(state() is None for state in states)
    finally:
        if enabled:
            gc.enable()


class _Skipping(nn.Module):
    """A model whose forward pass skips a layer of its own (a pooler, or an auxiliary head this loss does not use)."""

    def __init__(self, body):
        super().__init__()
        self.body, self.pooler = body, nn.Linear(3, 2).double().to(problems.DEVICE)

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("samples", [None, 3], ids=["exact", "subsampled"])
@pytest.mark.parametrize("name", ["mlp", "gpt", "lstm", "resnet_bn_train"])
def test_a_layer_the_forward_pass_skips_has_zero_individual_gradients_without_the_global_path(name, samples,
                                                                                              monkeypatch):
    """Its zeros take no backward pass per sample and no warning (they took the global path, whose note
    named "_Skipping runs its own code around its sub-modules' calls"), also beside BatchNorm in training mode,
    whose upstream layers do take it: NormTest of all parameters and of
    each, and GradVariance of each, are the brute force's with zero rows for it (exact, and the documented
    estimators of the drawn rows); its NormTest divides by ‖g‖ = 0: NaN, flagged as such."""
    from test_subsample import references

    used = _global_path_uses(monkeypatch)
    batch = 6
    problem = problems.make(name, batch, steps=2)
    model = _Skipping(problem.model)
    params = list(problem.model.parameters())
    spare = [len(params), len(params) + 1]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [quantities.NormTest(), quantities.GradVariance()], samples=samples, diagnose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, (x, y) in enumerate(problem.batches):
            state = {k: v.clone() for k, v in problem.model.state_dict().items()}
            snapshot = problems.Snapshot([p.detach().clone() for p in params], x, y, state, problems.rng_state())
            opt.zero_grad()
            loss = problem.lossfunc(model(x), y)
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            opt.step()
            grads = [g.reshape(batch, -1) for g in problems.individual_gradients(problem, snapshot)]
            entry = cp.get_output()[step]
            rows = list(range(batch)) if samples is None else subsample.draw(samples, batch, (0, step)).tolist()
            whole = references(torch.cat(grads, 1), rows)
            layers = [references(g, rows) for g in grads]
            if samples is None:  # (the exact statistics, not the estimators of a subsample)
                whole["NormTest"] = (norm_test(torch.cat(grads, 1)),)
                for layer, g in zip(layers, grads):
                    layer["NormTest"] = (norm_test(g),)
                    layer["GradVariance"] = (float(g.var(0).sum()),)
                    layer["_offset"] = 0.0
            problems.assert_close(entry["NormTest"], whole["NormTest"][0], what="NormTest, a skipped layer")
            problems.assert_close(entry["layers"]["NormTest"][: len(params)], [layer["NormTest"][0] for layer in layers])
            problems.assert_close(entry["GradVariance"], [max(layer["GradVariance"][0] - layer["_offset"], 0.0)
                                                          for layer in layers] + [0.0, 0.0])
            assert all(math.isnan(entry["layers"]["NormTest"][i]) for i in spare)
            zero = [f for f in entry["flags"] if "no gradient reaches it" in f]
            assert len(zero) == 2 and all(cp.names[i] in " ".join(zero) for i in spare)
    assert all(i not in indices for indices in used for i in spare)  # (the ResNet's layers before BatchNorm take it)
    assert not [w for w in caught if "global path" in str(w.message) and "pooler" in str(w.message)]


def test_a_skipped_layer_needs_no_individual_losses():
    """A hand-written cross-entropy (whose samples' losses the engine cannot derive) and a layer the forward pass
    skips: the step was refused (its zeros took the global path, which needs each sample's loss); now NormTest is
    the brute force's (the skipped layer's zero rows add nothing)."""
    torch.manual_seed(0)
    model = _Skipping(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double())
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False)
    loss = BatchMixingLoss()(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    params = list(model.body.parameters())
    terms = -(model(x).log_softmax(1).gather(1, y[:, None]))[:, 0]
    rows = torch.stack([6 * torch.cat([g.reshape(-1) for g in torch.autograd.grad(terms[n] / 6, params,
                                                                                  retain_graph=True)])
                        for n in range(6)])
    problems.assert_close(cp.get_output()[0]["NormTest"], norm_test(rows), what="NormTest, a skipped layer")


def test_backward_through_a_layer_info_loss_skips_is_flagged_as_another_loss_and_the_fix_works(monkeypatch):
    """``(ce + aux).backward()`` with ``info["loss"] = ce`` and an auxiliary head that only ``aux`` uses: its
    zeros are not its gradient, NaN and a flag naming another loss at every step (the layers ``ce`` reaches
    are exact); passing the sum as ``info["loss"]``, as the flag says, serves the head by its layer's rule."""
    used = _global_path_uses(monkeypatch)
    torch.manual_seed(0)
    model = _Skipping(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double())
    x, y, z = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,)), torch.randn(8, 3, dtype=torch.float64)
    cp = Cockpit(model, [quantities.GradVariance()], diagnose=False)
    for step in range(4):
        model.zero_grad()
        ce, aux = F.cross_entropy(model(x), y), model.pooler(z).pow(2).sum(1).mean()
        total = ce + aux
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cp(step, info={"loss": ce if step < 2 else total}):
                total.backward()
        values, flags = cp.get_output()[step]["GradVariance"], cp.get_output()[step].get("flags", [])
        said = [str(w.message) for w in caught if "are not those of the backward pass" in str(w.message)]
        if step < 2:
            assert all(math.isnan(v) for v in values[4:]) and all(math.isfinite(v) for v in values[:4])
            assert len(flags) == 2 and all("backward ran on another loss" in f for f in flags)
            assert len(said) == (2 if step == 0 else 0)  # (once per parameter)
            continue
        assert flags == [] and all(math.isfinite(v) and v > 0 for v in values)
        rows = torch.stack([8 * torch.cat([g.reshape(-1) for g in torch.autograd.grad(
            F.cross_entropy(model(x[n : n + 1]), y[n : n + 1]) / 8 + model.pooler(z[n : n + 1]).pow(2).sum() / 8,
            list(model.pooler.parameters()))]) for n in range(8)])
        problems.assert_close(sum(values[4:]), rows.var(0).sum(), what="GradVariance, the head's loss passed")
    assert used == []


class _FoldedLinear(nn.Module):
    """A Linear on pairs of features folded into the batch axis (``[B, 6] -> [2B, 3]``): no axis of its
    input is the samples' (Swin's windows, folded into the batch, are such a case)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        return self.inner(x.reshape(2 * x.shape[0], -1)).reshape(x.shape[0], -1)


def _global_path_warnings(model, x, y, steps=2, schedule=None):
    cp = Cockpit(model, [quantities.GradVariance(track_schedule=schedule)], diagnose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            model.zero_grad()
            loss = F.cross_entropy(model(x), y)
            with cp(step, info={"loss": loss}):
                loss.backward()
    return cp, [w for w in caught if "global path" in str(w.message)]


@pytest.mark.parametrize("case", ["batch_norm", "folded", "served"])
def test_the_parameters_a_plan_sends_to_the_global_path_are_named_once_with_the_reason(case):
    """The global path costs a vector-Jacobian product per sample at every tracked step: the parameters
    that the routing sends there are named once, with why, in a warning at the user's line; a model
    the rules serve says nothing."""
    torch.manual_seed(0)
    x, y = torch.randn(6, 3, 4, 4), torch.randint(0, 3, (6,))
    if case == "batch_norm":
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(16, 3))
        expected = "0.weight, 0.bias: a later BatchNorm2d mixes the samples of the batch", "2 parameter(s)"
    elif case == "folded":
        model = nn.Sequential(nn.Flatten(), nn.Linear(48, 6), _FoldedLinear(), nn.Linear(6, 3))
        expected = ("2.inner.weight, 2.inner.bias: the output of its Linear, of shape (12, 3), has no axis of size 6 "
                    "(the batch)", "2 parameter(s)")
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(48, 6), nn.ReLU(), nn.Linear(6, 3))
        expected = None
    cp, said = _global_path_warnings(model, x, y)
    if expected is None:
        assert said == []
        return
    assert len(said) == 1 and said[0].filename == __file__  # once, at the user's `with cp(step)`
    for words in expected:
        assert words in str(said[0].message)
    weight = expected[0].split(",")[0]  # served (exactly: the global path's own tests check the numbers)
    assert math.isfinite(cp.get_output()[1]["GradVariance"][cp.names.index(weight)])


def test_the_fix_the_global_path_note_names_runs_it_only_at_the_tracked_steps(monkeypatch):
    """The note's fix, a sparser schedule: over 6 steps tracked every third, the global path's passes
    run at steps 0 and 3 only, and the note is given once."""
    used = _global_path_uses(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(16, 3))
    cp, said = _global_path_warnings(model, torch.randn(6, 3, 4, 4), torch.randint(0, 3, (6,)), steps=6,
                                     schedule=lambda step: step % 3 == 0)
    assert len(said) == 1 and used == [[0, 1], [0, 1]] and sorted(cp.get_output()) == [0, 3]


def test_after_a_jump_in_the_step_numbers_the_forward_passes_are_watched_until_they_run_on_by_one():
    """A jump (a run resumed at another step, a loop that enters cp(step) every k steps) leaves the next
    step unpredictable: every forward pass is watched while the numbers jump, and only the due ones
    once they run on by one again (before, one jump watched every forward pass of the run)."""
    problem = problems.make("mlp", 4, steps=1)
    cp = Cockpit(problem.model, [quantities.NormTest(track_schedule=lambda s: s % 10 == 0)], diagnose=False)
    x, y = problem.batches[0]
    armed = {}
    for step in (0, 1, 5, 8, 9, 10, 11, 12):
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
        problem.model.zero_grad()
        armed[step] = cp.engine.capture.armed  # (for the next forward pass)
    assert armed == {0: False, 1: False, 5: True, 8: True, 9: True, 10: False, 11: False, 12: False}
    assert math.isfinite(cp.get_output()[10]["NormTest"])
