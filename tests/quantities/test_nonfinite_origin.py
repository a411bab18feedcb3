"""``NonfiniteOrigin`` on models where the first non-finite value is planted by hand.

The reference is the construction itself: each model makes its first Inf/NaN in a known
module with a known op, and nothing before it is non-finite.
"""

import math

import pytest
import torch
from torch import nn

import problems

from cockpit_lite import Cockpit
from cockpit_lite.quantities import NonfiniteOrigin
from cockpit_lite.quantities.nonfinite_origin import MAX_ANALYSED, creator_op, op_name


class Apply(nn.Module):
    """A parameter-free layer applying ``fn``."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def record(model, x, loss_fn=lambda out: out.square().mean(), steps=1):
    """The quantity's values at each of ``steps`` steps on the same batch."""
    cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
    values = []
    for step in range(steps):
        loss = loss_fn(model(x))
        with cp(step, info={"loss": loss}):
            loss.backward()
        values.append(cp.output.get(step, {}).get("NonfiniteOrigin"))
    cp.close()
    return values if steps > 1 else values[0]


def body(fn):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), Apply(fn), nn.Linear(4, 2))


X = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
HUGE = 1e3  # exp(1e3 · x) overflows float32 for |x| ≳ 0.09


@pytest.mark.parametrize("fn, op", [
    (lambda h: torch.log(h - 10), "log"),
    (lambda h: torch.log2(h - 10), "log"),
    (lambda h: torch.log10(h - 10), "log"),
    (lambda h: torch.log1p(h - 10), "log"),
    (lambda h: torch.xlogy(h, h - 10), "log"),
    (lambda h: h / (h - h), "div"),
    (lambda h: (h * HUGE).exp() * torch.zeros_like(h), "exp"),  # inf · 0: the exp overflowed first
    (lambda h: (HUGE * h).exp(), "exp"),
    (lambda h: torch.sqrt(h - 10), "sqrt"),
    (lambda h: torch.rsqrt(h - 10), "rsqrt"),
    (lambda h: torch.reciprocal(h - h), "div"),
    (lambda h: torch.pow(h - 10, 0.5), "pow"),
    (lambda h: torch.pow(-2.0 * torch.ones_like(h), h), "pow"),  # a tensor exponent (PowBackward1)
    (lambda h: (h + 1e30) * (h + 1e30), "mul"),
])
def test_names_the_layer_and_the_op(fn, op):
    value = record(body(fn), X)
    assert value == {"module": "1", "op": op, "params_nonfinite": False}


def test_the_earliest_creator_names_the_op():
    """A log makes the NaN; the exp, sqrt and log after it only pass it on."""
    value = record(body(lambda h: torch.log(torch.sqrt(torch.exp(torch.log(h - 10))) + 1)), X)
    assert value["op"] == "log" and value["module"] == "1"
    value = record(body(lambda h: torch.log(torch.sqrt(torch.exp(HUGE * h)) - 1e30)), X)
    assert value["op"] == "exp"


def test_a_finite_loss_records_nothing():
    assert record(body(torch.tanh), X) is None


def test_a_nonfinite_input():
    x = X.clone()
    x[2, 1] = math.nan
    assert record(body(torch.tanh), x) == {"module": "input", "op": "input", "params_nonfinite": False}


def test_the_loss_function():
    value = record(body(torch.tanh), X, loss_fn=lambda out: torch.log(out - 10).mean())
    assert value == {"module": "loss_fn", "op": "log", "params_nonfinite": False}


def test_nonfinite_parameters_name_their_layer_and_no_creator():
    model = body(torch.tanh)
    with torch.no_grad():
        model[2].weight[0, 1] = math.inf
    value = record(model, X)
    assert value == {"module": "2", "op": "addmm", "params_nonfinite": True}


def test_a_child_is_named_before_the_module_holding_it():
    """Calls are ordered by their end: the innermost non-finite output comes first."""
    inner = body(lambda h: torch.log(h - 10))
    model = nn.Sequential(nn.Linear(3, 3), inner)
    assert record(model, X)["module"] == "1.1"


def test_the_first_module_in_order_is_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), Apply(lambda h: torch.sqrt(h - 10)), Apply(lambda h: torch.log(h)))
    assert record(model, X) == {"module": "1", "op": "sqrt", "params_nonfinite": False}


def test_a_tuple_output_is_read_by_its_first_tensor():
    class Pair(nn.Module):
        def forward(self, h):
            return torch.log(h - 10), 3

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.pair = nn.Linear(3, 4), Pair()

        def forward(self, x):
            return self.pair(self.lin(x))[0]

    torch.manual_seed(0)
    assert record(Model(), X) == {"module": "pair", "op": "log", "params_nonfinite": False}


def test_only_the_first_steps_are_analysed():
    values = record(body(lambda h: torch.log(h - 10)), X, steps=MAX_ANALYSED + 2)
    assert [v["op"] for v in values] == ["log"] * MAX_ANALYSED + [None, None]
    assert all(v["module"] == "1" for v in values)


def test_a_forward_without_gradients_is_not_watched():
    model = body(lambda h: torch.log(h - 10))
    cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
    loss = model(X).square().mean()
    with torch.no_grad():
        model(X + 100)  # finite everywhere: must not replace the recorded outputs
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert cp.output[0]["NonfiniteOrigin"]["module"] == "1"
    cp.close()


def test_hooks_are_removed_on_close():
    model = body(torch.tanh)
    cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
    cp.close()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_creator_op_on_a_graph_without_a_creator():
    a = torch.tensor([math.inf], requires_grad=True)
    b = (a * 2).sum()
    assert creator_op(b.grad_fn) == "sum"
    assert op_name(torch.exp(a).grad_fn) == "exp" and op_name(a.sin().grad_fn) == "sin"


@pytest.mark.parametrize("inside", [True, False])
def test_a_cockpit_without_a_model_names_no_place_before_it_found_the_modules(inside):
    """Built from parameters only, step 0's forward pass ran unwatched: the module is
    unknown (None), never the loss function when the model made the NaN; the op is named.
    From step 1 on, the modules found in step 0 are watched: the place is named again."""
    model = body((lambda h: torch.log(h - 10)) if inside else torch.tanh)
    cp = Cockpit(model.parameters(), [NonfiniteOrigin()], diagnose=False)
    for step in range(2):
        out = model(X)
        loss = (out.mean() if inside else torch.log(out - 10).mean())
        with cp(step, info={"loss": loss}):
            loss.backward()
    cp.close()
    assert cp.output[0]["NonfiniteOrigin"] == {"module": None, "op": "log", "params_nonfinite": False}
    assert cp.output[1]["NonfiniteOrigin"]["module"] == ("1" if inside else "loss_fn")


def test_nan_loss_says_when_the_place_is_unknown():
    from cockpit_lite.diagnosis.rules.nan_loss import NanLoss

    entry = {"Loss": float("nan"), "NonfiniteOrigin": {"module": None, "op": "log", "params_nonfinite": False}}
    (finding,) = NanLoss().observe(0, entry, None)
    assert "no hook watched" in finding.message and "loss function" not in finding.message
    assert finding.layer is None and "log" in finding.suggestion


def test_finite_parameters_whose_output_overflows():
    """1e30 inputs times 1e10 weights overflow float32: the layer's parameters are finite."""
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    with torch.no_grad():
        model[0].weight.fill_(1e10)
    value = record(model, torch.full((4, 3), 1e30))
    assert value == {"module": "0", "op": "addmm", "params_nonfinite": False}


def test_the_parameters_of_a_child_the_module_uses_without_calling_it():
    """``MultiheadAttention`` multiplies by ``out_proj.weight`` without calling ``out_proj``."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.attn = nn.Linear(3, 4), nn.MultiheadAttention(4, 2, batch_first=True)

        def forward(self, x):
            h = self.lin(x)
            return self.attn(h, h, h)[0]

    torch.manual_seed(0)
    model = Model()
    with torch.no_grad():
        model.attn.out_proj.weight[1, 2] = math.nan
    value = record(model, torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(2)))
    assert value["module"] == "attn" and value["params_nonfinite"] is True


@pytest.mark.parametrize("fn", [
    lambda a: torch.sigmoid(a) * a,  # swish: the sigmoid is as deep as the log
    lambda a: a * torch.sigmoid(a),
    lambda a: a + torch.tanh(torch.tanh(torch.tanh(a))),  # the tanhs are deeper than the log
    lambda a: torch.tanh(a) + a,
    lambda a: a + 2 * torch.exp(torch.sigmoid(a)),
])
def test_an_op_saving_its_result_only_passes_on_a_nonfinite_input(fn):
    """tanh, sigmoid and exp save their result, not their input: a NaN result of theirs
    came from below, even where they are deeper than the log on another path."""
    assert record(body(lambda h: fn(torch.log(h - 10))), X) == {"module": "1", "op": "log", "params_nonfinite": False}


def test_an_op_named_by_its_saved_result():
    """expm1 is in neither table: it is recognised by its saved (infinite) result."""
    assert record(body(lambda h: torch.expm1(HUGE * h) + 1), X)["op"] == "expm1"


def test_a_product_with_a_constant_is_no_creator():
    """``h * c`` with ``c`` not requiring a gradient does not save ``h``: the product cannot be
    recomputed, so it is no creator; the log after it is."""
    c = torch.full((4,), 0.5)
    mul = (torch.ones(4, requires_grad=True) * c).grad_fn
    assert type(mul).__name__ == "MulBackward0" and mul._saved_self is None
    assert record(body(lambda h: torch.log(h * c - 10)), X)["op"] == "log"


def test_a_constant_first_operand_does_not_hide_the_other():
    """``c * log(h)``: the graph's edge for ``c`` is empty; the one after it leads to the log."""
    c = torch.full((4,), 0.5)
    assert record(body(lambda h: c * torch.log(h - 10)), X)["op"] == "log"


def test_a_deep_residual_graph_is_walked_once():
    """60 residual blocks ``h = h + sin(h)`` above the log: 2^60 paths, 120 nodes."""

    def fn(h):
        h = torch.log(h - 10)
        for _ in range(60):
            h = h + torch.sin(h)
        return h

    assert record(body(fn), X) == {"module": "1", "op": "log", "params_nonfinite": False}


def test_a_deep_residual_graph_without_a_creator_is_walked_once():
    """The same 60 blocks above an infinite constant: each node is tested once (2^60 paths)."""
    inf = torch.full((4,), math.inf)

    def fn(h):
        h = h + inf
        for _ in range(60):
            h = torch.sin(h) + h
        return h

    assert record(body(fn), X) == {"module": "1", "op": "add", "params_nonfinite": False}


def test_the_walk_stops_at_its_node_limit(monkeypatch):
    """With the limit below the graph's size the log is not reached: the output's op is named."""

    def fn(h):
        h = torch.log(h - 10)
        for _ in range(10):
            h = h + 1
        return h

    assert record(body(fn), X)["op"] == "log"
    monkeypatch.setattr("cockpit_lite.quantities.nonfinite_origin.MAX_NODES", 5)
    assert record(body(fn), X)["op"] == "add"
    # the walk starts at the last of the ten additions; the log is the 11th node it finds
    monkeypatch.setattr("cockpit_lite.quantities.nonfinite_origin.MAX_NODES", 10)
    assert record(body(fn), X)["op"] == "add"
    monkeypatch.setattr("cockpit_lite.quantities.nonfinite_origin.MAX_NODES", 11)
    assert record(body(fn), X)["op"] == "log"


def test_the_schedule_is_followed_and_verbose_prints(capsys):
    model = body(lambda h: torch.log(h - 10))
    cp = Cockpit(model, [NonfiniteOrigin(track_schedule=lambda s: s == 1, verbose=True)], diagnose=False)
    for step in range(3):
        loss = model(X).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
    cp.close()
    assert [s for s in range(3) if "NonfiniteOrigin" in cp.output.get(s, {})] == [1]
    assert cp.output[1]["NonfiniteOrigin"] == {"module": "1", "op": "log", "params_nonfinite": False}
    assert capsys.readouterr().out.count("NonfiniteOrigin") == 1
    record(model, X)
    assert "NonfiniteOrigin" not in capsys.readouterr().out  # not verbose by default


@pytest.mark.parametrize("reuse", [False, True])
def test_submodules_called_without_the_model(reuse):
    """A ``ModuleDict`` whose members the loop calls directly: the model's own forward never runs.
    With ``reuse``, a closed Cockpit ran first (each Cockpit with its own quantity)."""
    for fn, op in [(lambda h: torch.log(h - 10), "log")] * reuse + [(lambda h: torch.sqrt(h - 10), "sqrt")]:
        torch.manual_seed(0)
        model = nn.ModuleDict({"enc": nn.Linear(3, 4), "act": Apply(fn), "head": nn.Linear(4, 2)})
        cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
        loss = model["head"](model["act"](model["enc"](X))).square().mean()
        with cp(0, info={"loss": loss}):
            loss.backward()
        assert cp.output[0]["NonfiniteOrigin"] == {"module": "act", "op": op, "params_nonfinite": False}
        cp.close()


def test_the_first_floating_point_input_is_checked():
    """Token ids come first; the non-finite float features after them are the input named."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lin = nn.Embedding(10, 3), nn.Linear(3, 2)

        def forward(self, ids, features):
            return self.lin(self.emb(ids).sum(1) + features)

    features = X.clone()
    features[1, 2] = math.inf
    cp = Cockpit(model := Model(), [NonfiniteOrigin()], diagnose=False)
    loss = model(torch.randint(0, 10, (5, 4)), features).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert cp.output[0]["NonfiniteOrigin"] == {"module": "input", "op": "input", "params_nonfinite": False}
    cp.close()



class MaskedTokens(nn.Module):
    """Token ids and an additive causal mask (``nn.Transformer.generate_square_subsequent_mask``: −Inf
    above the diagonal), as the word-language-model recipe passes them: ``model(ids, mask)``."""

    def __init__(self, fn):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.mix, self.out, self.fn = nn.Embedding(10, 3), nn.Linear(3, 3), nn.Linear(3, 2), Apply(fn)

    def forward(self, ids, mask):
        h = self.emb(ids)  # [B, T, 3]
        h = torch.softmax(h @ h.transpose(1, 2) + mask, -1) @ self.mix(h)
        return self.out(self.fn(h)).mean(1)


@pytest.mark.parametrize("keyword", [False, True])
def test_an_attention_mask_s_minus_inf_is_not_a_nonfinite_input(keyword):
    """The mask is the first floating-point argument; its −Inf entries are intended: the layer that makes the
    NaN is named. A NaN in the mask is still the input's."""
    ids = torch.randint(0, 10, (5, 4), generator=torch.Generator().manual_seed(2))
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    broken = mask.clone()
    broken[3, 0] = math.nan
    for fn, m, expected in [(lambda h: torch.log(h - 10), mask, {"module": "fn", "op": "log"}),
                            (torch.tanh, broken, {"module": "input", "op": "input"})]:
        model = MaskedTokens(fn)
        cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
        loss = (model(ids, mask=m) if keyword else model(ids, m)).square().mean()
        with cp(0, info={"loss": loss}):
            loss.backward()
        assert cp.output[0]["NonfiniteOrigin"] == dict(expected, params_nonfinite=False)
        cp.close()


class KeywordInput(nn.Module):
    """``body(fn)`` taking its batch as ``x=`` (as Hugging Face models take ``inputs_embeds=``), or inside a
    dict (``{"x": batch}``: no tensor argument at all)."""

    def __init__(self, fn):
        super().__init__()
        self.body = body(fn)

    def forward(self, batch=None, x=None):
        return self.body(batch["x"] if x is None else x)


@pytest.mark.parametrize("passed", ["keyword", "dict"])
def test_a_batch_passed_by_keyword_or_in_a_dict(passed):
    """Without a positional tensor the replay still runs (with the keyword arguments) and names the layer; a
    non-finite batch passed by keyword is the input named."""
    nan_batch = X.clone()
    nan_batch[2, 1] = math.nan
    cases = [(lambda h: torch.log(h - 10), X, {"module": "body.1", "op": "log"})]
    if passed == "keyword":  # (a dict's entries are not looked into)
        cases.append((torch.tanh, nan_batch, {"module": "input", "op": "input"}))
    for fn, x, expected in cases:
        model = KeywordInput(fn)
        cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
        loss = (model(x=x) if passed == "keyword" else model({"x": x})).square().mean()
        with cp(0, info={"loss": loss}):
            loss.backward()
        assert cp.output[0]["NonfiniteOrigin"] == dict(expected, params_nonfinite=False)
        cp.close()

def test_outputs_without_a_tensor_are_skipped():
    """A probe returning ``None`` and a block returning a dict are passed over."""

    class Probe(nn.Module):
        def forward(self, h):
            return None

    class Block(nn.Module):
        def forward(self, h):
            return {"h": torch.log(h - 10)}

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.probe, self.block = nn.Linear(3, 4), Probe(), Block()

        def forward(self, x):
            h = self.lin(x)
            self.probe(h)
            return self.block(h)["h"]

    torch.manual_seed(0)
    assert record(Model(), X) == {"module": "", "op": "log", "params_nonfinite": False}


def test_an_overflowing_product_has_no_creator_and_names_the_output_op():
    """A matrix product that overflows is not recognised as a creator; the product after it only
    passes the Inf on (its saved input is non-finite), so the module's output op is named."""
    torch.manual_seed(0)
    big = torch.full((4, 4), 1e200, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 4), Apply(lambda h: ((h * 1e200) @ big) * h + 1)).double()
    assert record(model, X.double()) == {"module": "1", "op": "add", "params_nonfinite": False}


def _per_sequence_mean(h):
    """A masked mean over 2 positions of 2 features, one sequence empty: 0 / 0 for that row; the
    division by the count (which needs no gradient, so the numerator is not saved) makes the NaN,
    the mean over the features after it only passes it on."""
    mask = torch.ones(h.shape[0], 2)
    mask[0] = 0
    pooled = (h.reshape(h.shape[0], 2, 2) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return pooled.mean(1, keepdim=True).expand(-1, 4)


@pytest.mark.parametrize("fn", [
    _per_sequence_mean,
    lambda h: (h.sum(1, keepdim=True) / 0.0).mean(1, keepdim=True).expand(-1, 4),  # a Python zero divisor
    lambda h: torch.ops.aten.div.Scalar(h.sum(1, keepdim=True), 0.0).expand(-1, 4),  # (DivBackward1: a float)
    lambda h: h.div(torch.zeros(4), rounding_mode="floor") + 1,  # (DivBackward2)
], ids=["count", "python zero", "div.Scalar", "rounding mode"])
def test_a_division_by_zero_is_div_even_when_its_numerator_is_not_saved(fn):
    assert record(body(fn), X) == {"module": "1", "op": "div", "params_nonfinite": False}


@pytest.mark.parametrize("divide", [
    lambda h: h / (h.abs() + 1), lambda h: h / 2.0, lambda h: torch.ops.aten.div.Scalar(h, 2.0),
    lambda h: h.div(torch.full((4,), 3.0), rounding_mode="trunc") + h,
], ids=["by a tensor", "by a python number", "div.Scalar", "rounding mode"])
def test_a_division_by_nonzero_values_before_the_creator_is_not_named(divide):
    """A division with finite inputs and a divisor without a 0 creates nothing: the log of a negative after it
    is named."""
    assert record(body(lambda h: torch.log(divide(h) - 100.0)), X) == {
        "module": "1", "op": "log", "params_nonfinite": False}


def test_a_finite_step_runs_with_one_hook_and_a_replay_leaves_the_state_alone():
    """Every step one pre-hook on the model and no hook on its modules; at a non-finite loss the forward
    pass (dropout, BatchNorm in training mode) is replayed, and BatchNorm's running statistics and the
    user's random state are as they were."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm, self.drop, self.head = nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.drop(self.norm(self.lin(x))))

    torch.manual_seed(0)
    model = Model()
    cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
    loss = model(X).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert "NonfiniteOrigin" not in cp.output.get(0, {})
    # (the engine watches only the Cockpit's first forward pass: nothing else is due)
    assert len(model._forward_pre_hooks) == 1 and not any(m._forward_hooks for m in model.modules())
    out = model(X)
    state, rng = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
    loss = out.square().mean() * math.inf
    with cp(1, info={"loss": loss}):
        loss.backward()
    assert cp.output[1]["NonfiniteOrigin"]["module"] == "loss_fn"  # the model's outputs were finite
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items()) and torch.equal(rng, torch.get_rng_state())
    assert not any(m._forward_hooks for m in model.modules())
    cp.close()


@pytest.mark.parametrize("device", problems.CPU_AND_CUDA)
def test_a_replay_draws_the_same_dropout_masks_and_leaves_the_devices_random_state_alone(device):
    """The replay restores the random state the forward pass started with on the batch's device (on a GPU,
    its CUDA generator, which dropout there draws from): the replayed pass drops the units the step's own
    pass dropped, and the user's random state is as it was."""
    masks = []

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.drop, self.head = nn.Linear(3, 64), nn.Dropout(0.5), nn.Linear(64, 2)

        def forward(self, x):
            h = self.drop(self.lin(x))
            masks.append(h == 0)
            return self.head(h)

    torch.manual_seed(0)
    model = Model().to(device)
    out = model(X.to(device))
    cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
    out = model(X.to(device))
    before = problems.random_states(device)
    loss = out.square().mean() * math.inf
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert all(torch.equal(a, b) for a, b in zip(before, problems.random_states(device)))
    assert cp.output[0]["NonfiniteOrigin"]["module"] == "loss_fn" and len(masks) == 3  # (two passes, one replay)
    assert torch.equal(masks[1], masks[2]) and not torch.equal(masks[0], masks[1])  # the replay's mask is its pass's
    cp.close()


def test_a_loop_calling_the_parts_is_watched_module_by_module():
    """The model has a forward, but the training loop calls its parts: after the first step whose forward did
    not run through the model, every module is hooked, and the first non-finite output is named, at step 1
    already (the Cockpit was given the model: its first step's forward pass could have been seen)."""

    class Parts(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.act, self.head = nn.Linear(3, 4), Apply(lambda h: torch.log(h - 10)), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.enc(x))

    torch.manual_seed(0)
    model = Parts()
    cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
    for step in range(3):
        h = model.enc(X)
        loss = model.head(model.act(h) if step >= 1 else h).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
    assert all(len(m._forward_hooks) == 1 for m in model.modules())  # (hooked once, not at every step)
    for step in (1, 2):
        assert cp.output[step]["NonfiniteOrigin"] == {"module": "act", "op": "log", "params_nonfinite": False}
    cp.close()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_freed_graph_names_no_division_it_cannot_read():
    """A backward pass that ran before the ``with`` block freed the graph's saved values: a division (by 2)
    whose divisor can no longer be read is not taken for the creator; the walk ends at the graph's root."""
    from cockpit_lite.quantities.nonfinite_origin import creator_op

    h = torch.randn(4, requires_grad=True)
    loss = torch.log(h / 2.0 - 100.0).sum()
    loss.backward()
    assert creator_op(loss.grad_fn) == "sum"


def test_the_replay_runs_under_the_autocast_of_the_steps_forward_pass():
    """A Linear whose float16 output overflows under CPU autocast (its float32 output is finite): the replay,
    under the same autocast, names it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    with torch.no_grad():
        model[1].weight.mul_(1e5)
    x = 10 * X
    assert bool(torch.isfinite(model(x)).all())
    cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = out.float().square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert cp.output[0]["NonfiniteOrigin"] == {"module": "1", "op": "addmm", "params_nonfinite": False}


def test_a_loss_of_several_entries_is_finite_when_every_entry_is():
    from cockpit_lite.quantities.nonfinite_origin import _finite

    assert _finite(torch.tensor([1.0, 2.0])) and _finite(torch.tensor([[3.0]]))
    assert not _finite(torch.tensor([1.0, math.nan])) and not _finite(torch.tensor([math.inf, 1.0, 2.0]))
    assert not _finite(torch.tensor(math.inf))


def test_a_loop_that_skips_the_backward_of_a_bad_loss_still_gets_its_origin():
    """The origin is of the forward pass: a loop that backpropagates only finite losses (a common guard)
    records it at the bad step, beside the flag that no backward pass ran (before: NaN there)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    cp = Cockpit(model, [NonfiniteOrigin()], diagnose=False)
    for step in range(3):
        x = torch.randn(5, 3)
        if step == 1:
            x[2, 1] = math.nan
        loss = nn.functional.cross_entropy(model(x), torch.zeros(5, dtype=torch.long))
        with cp(step, info={"loss": loss}):
            if torch.isfinite(loss):
                loss.backward()
    assert sorted(cp.output) == [1]
    assert cp.output[1]["NonfiniteOrigin"] == {"module": "input", "op": "input", "params_nonfinite": False}
    assert any("no backward pass" in f for f in cp.output[1]["flags"])
