"""``ActivationStats`` against numpy (float64) on the module outputs of the same forward pass."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import ActivationStats
from cockpit_lite.quantities.activation_stats import (DEAD_MIN_SAMPLES, SATURATION, SUB_BATCH, _global_statistics,
                                                     _partial)


def reference(y, kind):
    y = np.asarray(y, dtype=np.float64)
    sub = y[:SUB_BATCH]
    out = {"mean": y.mean(), "std": y.std(), "zeros": np.mean(sub == 0)}
    out["dead"] = None if kind != "relu" else np.nan if len(y) < DEAD_MIN_SAMPLES else 1 - np.mean((y > 0).any(axis=0))
    if kind == "tanh":
        out["saturated"] = np.mean(np.abs(sub) > SATURATION)
    elif kind == "sigmoid":
        out["saturated"] = np.mean((sub < 1 - SATURATION) | (sub > SATURATION))
    else:
        out["saturated"] = None
    return out


def recorded_and_outputs(model, x, steps=2):
    outputs = {}
    names = {m: n for n, m in model.named_modules()}
    handles = [m.register_forward_hook(lambda mod, a, out: outputs.setdefault(names[mod], []).append(
        out.detach().numpy().copy())) for m in model.modules() if not list(m.children())]  # (every leaf's)
    cp = Cockpit(model, [ActivationStats()], diagnose=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        outputs.clear()
        opt.zero_grad()
        loss = model(x).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
        opt.step()
    for h in handles:
        h.remove()
    return cp.output[steps - 1]["ActivationStats"], outputs


@pytest.mark.parametrize("batch", [5, 40])  # below and above the sub-batch
def test_mlp_relu_tanh_sigmoid(batch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 30), nn.ReLU(), nn.Linear(30, 20), nn.Tanh(), nn.Linear(20, 10),
                          nn.Sigmoid())
    with torch.no_grad():
        model[0].bias.sub_(0.8)  # some dead units
        model[2].weight.mul_(30)  # some saturated tanh outputs
        model[4].weight.mul_(8)
    x = torch.randn(batch, 6)
    stats, outputs = recorded_and_outputs(model, x)
    assert_as_reference(stats, outputs, {"1": ("ReLU", "relu"), "3": ("Tanh", "tanh"), "5": ("Sigmoid", "sigmoid")})
    assert (0 < stats["1"]["dead"] < 1 if batch >= DEAD_MIN_SAMPLES else np.isnan(stats["1"]["dead"]))
    assert stats["3"]["saturated"] > 0.05


def assert_as_reference(stats, outputs, expected):
    """``stats`` hold exactly the modules of ``expected`` (``name: (type, kind)``), each as ``reference`` of its
    output in the same forward pass."""
    assert list(stats) == list(expected)
    for name, (type_name, kind) in expected.items():
        ref = reference(outputs[name][0], kind)
        assert stats[name]["type"] == type_name
        for key, value in ref.items():
            if value is None:
                assert stats[name][key] is None
            elif np.isnan(value):  # too few samples to tell a dead unit from one that did not fire by chance
                assert np.isnan(stats[name][key]), (name, key)
            else:
                assert stats[name][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, key)


class ReLUSquaredActivation(nn.Module):
    """Hugging Face's ``relu2`` (Primer): a ReLU family member of another library."""

    def forward(self, x):
        return torch.relu(x).square()


class Tanh(nn.Module):
    """timm's ``Tanh`` and ``Sigmoid`` (``create_act_layer("tanh")``): classes of their own, not torch's."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return x.tanh_() if self.inplace else x.tanh()


class Sigmoid(Tanh):
    def forward(self, x):
        return x.sigmoid_() if self.inplace else x.sigmoid()


class NewGELU(nn.Module):
    """minGPT's GELU (the tanh approximation written out)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_activation_classes_of_other_libraries_are_watched_by_their_names():
    """Before, only ``torch.nn``'s classes were: a ViT of timm's ``GELU`` or a BERT of ``GELUActivation`` had no
    activation statistics, an EfficientNet's SE gates (timm's ``Sigmoid``) no saturation."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 30), ReLUSquaredActivation(), nn.Linear(30, 20), Tanh(), nn.Linear(20, 10),
                          Sigmoid(inplace=True), nn.Linear(10, 8), NewGELU(), nn.Linear(8, 3), nn.Hardswish())
    with torch.no_grad():
        model[0].bias.sub_(0.8)
        model[2].weight.mul_(30)
        model[4].weight.mul_(8)
    stats, outputs = recorded_and_outputs(model, torch.randn(40, 6))
    assert_as_reference(stats, outputs, {"1": ("ReLUSquaredActivation", "relu"), "3": ("Tanh", "tanh"),
                                         "5": ("Sigmoid", "sigmoid"), "7": ("NewGELU", None), "9": ("Hardswish", None)})
    assert 0 < stats["1"]["dead"] < 1 and stats["3"]["saturated"] > 0.05


class SigmoidGate(nn.Module):
    """Named like an activation, but a layer with weights of its own."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return torch.sigmoid(x * self.weight)


class TanhMean(nn.Module):
    """Named like an activation, but not elementwise: its output has another shape."""

    def forward(self, x):
        return x.tanh().mean(1, keepdim=True).expand(-1, 2)


class ReLUBlock(nn.Module):
    """Named like an activation, but a block of modules: its own ``nn.ReLU`` is watched."""

    def __init__(self):
        super().__init__()
        self.linear, self.act = nn.Linear(5, 5), nn.ReLU()

    def forward(self, x):
        return self.act(self.linear(x))


def test_modules_named_like_activations_that_are_not_one_are_not_watched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), SigmoidGate(5), ReLUBlock(), nn.LogSigmoid(), TanhMean(), nn.PReLU())
    stats = run(model, torch.randn(12, 3))
    assert list(stats) == ["2.act", "5"] and stats["5"]["type"] == "PReLU" and stats["5"]["dead"] is None


def test_every_activation_of_hugging_face_is_watched():
    """``transformers.activations``: each of its classes but the identity (``linear``) and the Laplace one."""
    activations = pytest.importorskip("transformers.activations", reason="the hf extra is not installed")
    names = ["gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_pytorch_tanh", "gelu_accurate", "mish", "quick_gelu",
             "relu2", "silu", "relu6", "linear"]
    model = nn.Sequential(*[module for name in names for module in (nn.Linear(4, 4), activations.ACT2FN[name])])
    stats = run(model, torch.randn(12, 4))
    assert [(stats[str(2 * i + 1)]["type"], stats[str(2 * i + 1)]["dead"] is not None) for i in range(len(names) - 1)] == [
        (type(activations.ACT2FN[name]).__name__, name in ("relu2", "relu6")) for name in names[:-1]]
    assert str(2 * len(names) - 1) not in stats



@pytest.mark.parametrize("kind", ["relu", "tanh", "sigmoid"])
def test_the_ranks_partial_sums_give_the_whole_batchs_statistics(kind):
    """FSDP2's reduction (each rank's ``_partial``, then ``_global_statistics`` in rank order) against numpy
    on the whole batch: two ranks holding 13 and 7 of 20 samples (the first ``SUB_BATCH`` samples, whose
    zeros and tails are counted, cross the ranks' boundary); a unit that never fires, ReLU units whose
    largest output is below 1."""
    pre = torch.randn(20, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.4
    pre[:, 0] -= 5
    y = {"relu": pre.relu(), "tanh": (8 * pre).tanh(), "sigmoid": (8 * pre).sigmoid()}[kind]
    stats = _global_statistics([_partial(y[:13], kind), _partial(y[13:], kind)], kind)
    ref = reference(y.numpy(), kind)
    for key, value in zip(("mean", "std", "zeros", "dead", "saturated"), stats.tolist()):
        assert value == pytest.approx(0.0 if ref[key] is None else ref[key], rel=1e-6, abs=1e-7), key  # (0: n/a)
    if kind == "relu":
        fired = y.amax(0)
        assert ref["dead"] == pytest.approx(1 / 6) and ((fired > 0) & (fired < 1)).any()
    else:
        assert 0 < ref["saturated"] < 1


def _outputs(kind, shape):
    """Outputs of ``kind`` of ``shape`` with exact zeros, entries exactly at the tails' bound (``SATURATION``: not
    in the tails) and, for ReLU, a unit that never fires."""
    pre = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = {"relu": (pre - 0.3).relu(), "tanh": (3 * pre).tanh(), "sigmoid": (4 * pre).sigmoid()}[kind]
    flat = y.view(-1)
    flat[::5] = -SATURATION if kind == "tanh" else SATURATION if kind == "sigmoid" else 0.0
    flat[1::7] = SATURATION
    flat[2::9] = 0.0
    if kind == "relu" and y.dim() > 1:
        y[:, 0] = 0.0
    return y


@pytest.mark.parametrize("kind", ["relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("shape, split", [((25,), (18, 7)), ((20, 2, 3), (18, 2)), ((20, 2, 3), (20,))],
                         ids=["1d", "conv-like", "one rank"])
def test_partial_sums_of_any_output_give_the_whole_batchs_statistics(kind, shape, split):
    """A 1-d output (every entry a sample: zeros and tails over all entries, not the first ``SUB_BATCH``) split
    18 / 7, a ``[B, C, L]`` output whose first rank holds more than ``SUB_BATCH`` samples, and one rank alone:
    ``_global_statistics`` of the parts against numpy on the whole output."""
    y = _outputs(kind, shape)
    parts = [_partial(part, kind) for part in torch.split(y, list(split))]
    stats = _global_statistics(parts, kind)
    ref = reference(y.numpy().reshape(-1, 1) if len(shape) == 1 else y.numpy(), kind)
    if len(shape) == 1:  # (a batch of scalars: every entry counts)
        ref["zeros"] = np.mean(y.numpy() == 0)
        if kind == "tanh":
            ref["saturated"] = np.mean(np.abs(y.numpy()) > SATURATION)
        elif kind == "sigmoid":
            ref["saturated"] = np.mean((y.numpy() - 0.5 > SATURATION - 0.5) | (0.5 - y.numpy() > SATURATION - 0.5))
    for key, value in zip(("mean", "std", "zeros", "dead", "saturated"), stats.tolist()):
        expected = 0.0 if ref[key] is None else ref[key]
        assert value == pytest.approx(expected, rel=1e-6, abs=1e-7), key  # (0: n/a)
    assert ref["zeros"] > 0 and (ref["dead"] > 0 if kind == "relu" and len(shape) > 1 else
                                 kind == "relu" or 0 < ref["saturated"] < ((y.abs() >= SATURATION).double().mean()))


@pytest.mark.parametrize("split", [(5, 3), (4, 3)], ids=["8 samples", "7 samples"])
def test_dead_units_are_measured_from_the_ranks_samples_together(split):
    """``dead`` needs ``DEAD_MIN_SAMPLES`` samples of the whole batch, not of a rank: 5 + 3 = 8 are enough (a
    unit that fires on the second rank's samples alone is alive), 4 + 3 = 7 are not (NaN)."""
    y = torch.zeros(sum(split), 3, dtype=torch.float64)
    y[:, 0] = 1.0
    y[-1, 1] = 0.5
    stats = _global_statistics([_partial(part, "relu") for part in torch.split(y, list(split))], "relu")
    assert sum(split) >= DEAD_MIN_SAMPLES or math.isnan(stats[3].item())
    assert sum(split) < DEAD_MIN_SAMPLES or stats[3].item() == pytest.approx(1 / 3)


class _Routed(nn.Module):
    """An expert's activation called on the samples routed to it: none at the first call, all at the second."""

    def __init__(self):
        super().__init__()
        self.lin, self.act = nn.Linear(4, 6), nn.ReLU()

    def forward(self, x):
        h = self.lin(x)
        return self.act(h[:0]).sum() + self.act(h).sum(1)


def test_a_call_whose_output_has_no_entries_adds_nothing():
    """The empty call (``[0, 6]``) is not averaged in (its mean is NaN): the statistics are the other call's."""
    torch.manual_seed(0)
    stats, outputs = recorded_and_outputs(_Routed(), torch.randn(12, 4))
    assert [o.shape for o in outputs["act"]] == [(0, 6), (12, 6)]
    for key, value in reference(outputs["act"][1], "relu").items():
        assert stats["act"][key] == (None if value is None else pytest.approx(value, rel=1e-5, abs=1e-6)), key


@pytest.mark.parametrize("kind, shape", [("relu", (8, 3)), ("relu", (7, 3)), ("tanh", (20, 2, 3)),
                                         ("sigmoid", (20, 2, 3))])
def test_one_process_statistics_at_their_bounds(kind, shape):
    """``_statistics`` (one process) of outputs with entries exactly at the tails' bound, and ReLU outputs of
    exactly ``DEAD_MIN_SAMPLES`` samples (dead units measured) and one fewer (NaN), against numpy."""
    from cockpit_lite.quantities.activation_stats import _statistics

    y = _outputs(kind, shape)
    ref = reference(y.numpy(), kind)
    for key, value in zip(("mean", "std", "zeros", "dead", "saturated"), _statistics(y, kind).tolist()):
        expected = 0.0 if ref[key] is None else ref[key]
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-6, nan_ok=True), key
    assert kind == "relu" or 0 < ref["saturated"] < (y.abs() >= SATURATION).double().mean()


def test_one_process_statistics_are_made_on_the_outputs_device():
    """On another device (``meta`` stands in for a GPU), a batch too small for ``dead`` included."""
    from cockpit_lite.quantities.activation_stats import _statistics

    assert _statistics(torch.empty(4, 3, device="meta"), "relu").device.type == "meta"


def test_a_recurrent_layers_saturation_is_its_first_ranks_gates():
    """A recurrent layer's ``saturated`` comes from its gates (recomputed on each rank's first sequences): the
    first rank's fraction; without gates (a packed sequence) NaN."""
    y = torch.randn(10, 4, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    stats = _global_statistics([_partial(y[:6], "recurrent", 0.25), _partial(y[6:], "recurrent", 0.5)], "recurrent")
    assert stats[4].item() == 0.25 and stats[3].item() == 0.0
    assert stats[0].item() == pytest.approx(y.mean().item(), rel=1e-6)
    assert math.isnan(_global_statistics([_partial(y, "recurrent")], "recurrent")[4].item())


def test_conv_units_are_channel_pixels_and_repeated_calls_average():
    torch.manual_seed(1)
    relu = nn.ReLU()

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 3, padding=1)
            self.act = relu
            self.head = nn.Linear(3 * 5 * 5, 2)

        def forward(self, x):
            h = self.act(self.conv(x))
            return self.head(self.act(h - 0.3).flatten(1))  # the same ReLU module twice

    model = Twice()
    x = torch.randn(24, 2, 5, 5)
    stats, outputs = recorded_and_outputs(model, x)
    first, second = (reference(y, "relu") for y in outputs["act"])
    for key in ("mean", "std", "zeros", "dead"):
        assert stats["act"][key] == pytest.approx((first[key] + second[key]) / 2, rel=1e-5, abs=1e-6), key


def test_untracked_forward_passes_are_not_counted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    cp = Cockpit(model, [ActivationStats(track_schedule=lambda s: s == 1)], diagnose=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        with torch.no_grad():
            model(torch.full((7, 4), 100.0))  # evaluation: not recorded
        opt.zero_grad()
        loss = model(torch.randn(7, 4)).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
        opt.step()
    assert sorted(s for s, e in cp.output.items() if "ActivationStats" in e) == [1]
    assert cp.output[1]["ActivationStats"]["1"]["mean"] < 10


def run(model, x, quantity=None, forward=None):
    """One step; the quantity's value (``None`` when nothing was recorded)."""
    cp = Cockpit(model, [quantity or ActivationStats()], diagnose=False)
    loss = (forward(model, x) if forward else model(x)).float().square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    cp.close()
    return cp.output.get(0, {}).get("ActivationStats")


@pytest.mark.parametrize("act", [nn.LeakyReLU(), nn.ELU(), nn.GELU(), nn.SiLU(), nn.Softplus(), nn.Mish(), nn.PReLU(),
                                 nn.CELU(), nn.SELU(), nn.Hardswish()], ids=lambda act: type(act).__name__)
def test_other_activations_have_no_dead_or_saturated(act):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), act, nn.Linear(6, 1))
    x = torch.randn(9, 4)
    y = act(model[0](x)).detach().double().numpy()
    stats = run(model, x)["1"]
    assert stats["type"] == type(act).__name__ and stats["dead"] is None and stats["saturated"] is None
    assert stats["mean"] == pytest.approx(y.mean(), rel=1e-5) and stats["std"] == pytest.approx(y.std(), rel=1e-4)


def test_an_evaluation_forward_at_a_due_step_is_not_counted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(7, 4)

    def forward(model, x):
        with torch.no_grad():
            model(torch.full((7, 4), 3.0))
        return model(x)

    y = torch.tanh(model[0](x)).detach().numpy()
    stats = run(model, x, forward=forward)["1"]
    for key, value in reference(y, "tanh").items():
        assert stats[key] == (None if value is None else pytest.approx(value, rel=1e-5, abs=1e-6)), key


def test_scalar_and_integer_outputs_are_skipped():
    """A sigmoid gate on a 0-d parameter, and a ReLU clamping (integer) token ids."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.clamp, self.emb, self.gate = nn.ReLU(), nn.Embedding(10, 3), nn.Sigmoid()
            self.alpha = nn.Parameter(torch.tensor(0.3))

        def forward(self, ids):
            return self.gate(self.alpha) * self.emb(self.clamp(ids))

    assert run(Model(), torch.tensor([[1, -1, 4], [2, 3, -1]])) is None


def test_a_one_dimensional_output_is_a_batch_of_scalars():
    """A ReLU on a squeezed scalar head, shape (B,): one unit, dead when it never fires;
    zeros over all B entries."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 1), nn.Flatten(0), nn.ReLU())
    x = torch.randn(30, 3)
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
        model[0].bias.fill_(0.0)
    y = torch.relu(x[:, 0]).numpy()
    stats = run(model, x)["2"]
    assert stats["dead"] == 0.0 and 0 < np.mean(y[SUB_BATCH:] == 0) != np.mean(y[:SUB_BATCH] == 0)
    assert stats["zeros"] == pytest.approx(np.mean(y == 0))
    assert stats["mean"] == pytest.approx(y.mean(), rel=1e-5)
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # the head never fires
    assert run(model, x)["2"]["dead"] == 1.0


def test_close_removes_the_hooks_and_a_new_cockpit_takes_a_new_quantity():
    torch.manual_seed(0)
    quantity = ActivationStats()
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 1))
    x = torch.randn(6, 4)
    first = run(model, x, quantity)
    assert not model[1]._forward_hooks
    other = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 1))
    with pytest.raises(ValueError, match="already belongs to another Cockpit"):
        run(other, x, quantity)  # a quantity keeps its run's state: one Cockpit each
    second = run(other, x, ActivationStats())
    y = torch.tanh(other[0](x)).detach().numpy()
    assert first["1"]["type"] == "ReLU" and second["1"]["type"] == "Tanh"
    assert second["1"]["mean"] == pytest.approx(y.mean(), rel=1e-5)


def test_the_schedule_is_followed_and_verbose_prints(capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    for verbose in (False, True):
        quantity = ActivationStats(track_schedule=lambda s: s in (0, 2), verbose=True) if verbose else \
            ActivationStats(track_schedule=lambda s: s in (0, 2))
        cp = Cockpit(model, [quantity], diagnose=False)
        for step in range(3):
            loss = model(torch.randn(7, 4)).square().mean()
            with cp(step, info={"loss": loss}):
                loss.backward()
        cp.close()
        assert sorted(s for s, e in cp.output.items() if "ActivationStats" in e) == [0, 2]
        assert capsys.readouterr().out.count("ActivationStats") == (2 if verbose else 0)


def test_a_step_that_is_not_due_runs_without_the_hooks():
    """The activation modules (and the model's input) are hooked only before a forward pass whose step is
    due: schedule {0, 3}: armed for steps 0 and 3, no hook in the forward passes of steps 1 and 2."""
    from cockpit_lite.quantities import InputStats

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    due = lambda s: s in (0, 3)  # noqa: E731
    inputs = InputStats(track_schedule=due)
    cp = Cockpit(model, [ActivationStats(track_schedule=due), inputs], diagnose=False)
    armed = []
    for step in range(4):
        armed.append((len(model[1]._forward_hooks), len(model[0]._forward_pre_hooks),
                      any(getattr(h, "__self__", None) is inputs for h in model._forward_pre_hooks.values())))
        loss = model(torch.randn(7, 4)).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
    # (the first: armed before any step is known)
    assert [(a > 0, i) for a, _, i in armed] == [(True, True), (False, False), (False, False), (True, True)]
    assert armed[1][:2] == armed[2][:2] == (0, 0)
    assert sorted(s for s, e in cp.output.items() if "ActivationStats" in e) == [0, 3]
    assert sorted(s for s, e in cp.output.items() if "InputStats" in e) == [0, 3]


class _PositionsFirst(nn.Module):
    """A learned table through dropout and its own projection before the input reaches its layer."""

    def __init__(self):
        super().__init__()
        self.pos, self.drop = nn.Parameter(torch.randn(4, 4)), nn.Dropout(0.0)
        self.pos_proj, self.inp, self.act = nn.Linear(4, 4), nn.Linear(4, 4), nn.ReLU()

    def forward(self, x):
        positions = self.pos_proj(self.drop(self.pos))
        return self.act(positions + self.inp(x))


class _TokensFirst(nn.Module):
    """Token ids (not floating point: no input to follow) through an embedding, dropout and a layer."""

    def __init__(self):
        super().__init__()
        self.emb, self.drop, self.lin, self.act = nn.Embedding(5, 4), nn.Dropout(0.0), nn.Linear(4, 4), nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(self.drop(self.emb(x))))


@pytest.mark.parametrize("model, x, found", [
    (_PositionsFirst, lambda: torch.randn(4, 4), {"name": "inp", "type": "Linear"}),
    (_TokensFirst, lambda: torch.randint(0, 5, (4, 3)), None),
], ids=["a table through dropout first", "token ids"])
def test_only_the_input_and_its_pass_through_copies_are_followed(model, x, found):
    """A pass-through module's output is followed only where its input is the model's input (or a copy of it):
    not a dropped-out table (its projection is not the input layer), not a dropout on an embedding's output when
    the input is token ids (no input layer)."""
    torch.manual_seed(0)
    net = model()
    cp = Cockpit(net, [ActivationStats()], diagnose=False)
    loss = net(x()).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert (cp.output[0].get("meta", {}).get("ActivationStats") or {}).get("input_layer") == found


class _MaskFirst(nn.Module):
    """A second floating-point argument (a mask) through layers of its own before the input reaches its layer,
    one of them called by keyword (no positional argument)."""

    def __init__(self):
        super().__init__()
        self.extra, self.gate, self.inp, self.act = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.ReLU()

    def forward(self, x, mask):
        bias, gate = self.extra(input=mask), self.gate(mask)
        return self.act(self.inp(x) * gate + bias)


def test_the_input_layer_is_the_first_arguments_not_another_floating_point_arguments():
    torch.manual_seed(0)
    model = _MaskFirst()
    cp = Cockpit(model, [ActivationStats()], diagnose=False)
    loss = model(torch.randn(4, 4), torch.rand(4, 4)).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert cp.output[0]["meta"]["ActivationStats"]["input_layer"] == {"name": "inp", "type": "Linear"}


def test_the_search_for_the_input_layer_ends_after_three_training_forward_passes():
    """An input transformed by a functional op before any module sees it: the leaves' pre-hooks that look for
    it are removed at the step after the third training forward pass; a forward pass without gradients in
    each step (a validation pass) does not count."""
    from cockpit_lite.quantities.activation_stats import LOOK

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.act = nn.Linear(4, 4), nn.ReLU()

        def forward(self, x):
            return self.act(self.lin(2 * x))

    torch.manual_seed(0)
    model = Scaled()
    cp = Cockpit(model, [ActivationStats()], diagnose=False)
    hooked = []
    for step in range(LOOK + 1):
        with torch.no_grad():
            model(torch.randn(4, 4))
        loss = model(torch.randn(4, 4)).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
        hooked.append(len(model.lin._forward_pre_hooks))
    assert LOOK == 3 and [h > 0 for h in hooked] == [True, True, False, False]
    assert "input_layer" not in (cp.output[0].get("meta", {}).get("ActivationStats") or {})


def test_input_layer_is_the_first_module_the_input_reaches_through_pass_through_modules():
    from cockpit_lite import Cockpit

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(8, 2)      # registered first, runs last
            self.flat = nn.Flatten()
            self.body = nn.Sequential(nn.BatchNorm1d(8), nn.ReLU())  # (a container: its first leaf is the layer)

        def forward(self, x):
            return self.head(self.body(self.flat(x)))

    for keyword in (False, True):  # (model(x=batch): found through the keyword arguments too)
        model = Net()
        cp = Cockpit(model, [ActivationStats()], diagnose=False)
        for step in range(2):
            x = torch.randn(6, 2, 4)
            loss = (model(x=x) if keyword else model(x)).square().mean()
            with cp(step, info={"loss": loss}):
                loss.backward()
        for step in range(2):
            assert cp.output[step]["meta"]["ActivationStats"]["input_layer"] == {"name": "body.0", "type": "BatchNorm1d"}


def _cell_reference(module, x, state=None):
    """Gate values of a one-layer, one-direction batch-first LSTM/GRU: the hidden states from torch's
    own cell (nn.LSTMCell / nn.GRUCell with the module's weights), the gates from those states; from the
    initial ``state`` (``h0``, or ``(h0, c0)``, [1, B, hidden]) or zeros."""
    lstm = isinstance(module, nn.LSTM)
    cell = (nn.LSTMCell if lstm else nn.GRUCell)(module.input_size, module.hidden_size)
    with torch.no_grad():
        for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, k).copy_(getattr(module, k + "_l0"))
    x = x[:SUB_BATCH].double()
    cell = cell.double()
    h = x.new_zeros(x.shape[0], module.hidden_size)
    c = h.clone()
    if state is not None:
        h = (state[0] if lstm else state)[0, :SUB_BATCH].double()
        c = state[1][0, :SUB_BATCH].double() if lstm else c
    sigmoid_gates, tanh_gates, hs = [], [], []
    with torch.no_grad():
        for t in range(x.shape[1]):
            gi = x[:, t] @ cell.weight_ih.T + cell.bias_ih
            gh = h @ cell.weight_hh.T + cell.bias_hh
            if lstm:
                i, f, g, o = (gi + gh).chunk(4, -1)
                sigmoid_gates += [i.sigmoid(), f.sigmoid(), o.sigmoid()]
                tanh_gates.append(g.tanh())
                h, c = cell(x[:, t], (h, c))
            else:
                (xr, xz, xn), (hr, hz, hn) = gi.chunk(3, -1), gh.chunk(3, -1)
                r = (xr + hr).sigmoid()
                sigmoid_gates += [r, (xz + hz).sigmoid()]
                tanh_gates.append((xn + r * hn).tanh())
                h = cell(x[:, t], h)
            hs.append(h)
    sig, tan = torch.cat([s.reshape(-1) for s in sigmoid_gates]), torch.cat([s.reshape(-1) for s in tanh_gates])
    tails = ((sig - 0.5).abs() > SATURATION - 0.5).sum() + (tan.abs() > SATURATION).sum()
    return float(tails) / (sig.numel() + tan.numel()), torch.stack(hs, 1)


def _saturating(kind):
    """A batch-first ``kind(5, 7)`` (seed 0) with 8 times its initial weights: many gates saturate."""
    torch.manual_seed(0)
    rnn = kind(5, 7, batch_first=True)
    with torch.no_grad():
        for name, p in rnn.named_parameters():
            if "weight" in name:
                p.mul_(8)
    return rnn


def _recorded(rnn, x, *state):
    """ActivationStats' record of ``rnn``, called as ``rnn(x, *state)`` in a model with a linear readout."""
    class Readout(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = rnn, nn.Linear(7, 3)

        def forward(self, x):
            return self.head(self.rnn(x, *state)[0][:, -1])

    model = Readout()
    cp = Cockpit(model, [ActivationStats()], diagnose=False)
    loss = model(x).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    return cp.output[0]["ActivationStats"]["rnn"]


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_recurrent_gates_match_torchs_own_cell(kind):
    """The gates inside nn.LSTM/nn.GRU (no hook reaches them): a large initialisation saturates
    them, and the recorded fraction is the one computed from torch's own cell's states."""
    from cockpit_lite.quantities.activation_stats import recurrent_gates

    rnn = _saturating(kind)
    x = torch.randn(20, 6, 5)
    expected, states = _cell_reference(rnn, x)
    output, saturated = recurrent_gates(rnn, x)
    torch.testing.assert_close(output.double(), states, rtol=1e-4, atol=1e-5)
    assert float(saturated) == pytest.approx(expected, abs=2e-3) and expected > 0.3

    stats = _recorded(rnn, x)
    assert stats["type"] == kind.__name__ and stats["dead"] is None
    assert stats["saturated"] == pytest.approx(expected, abs=2e-3)
    out = rnn(x)[0].detach().double()
    assert stats["mean"] == pytest.approx(float(out.mean()), rel=1e-4)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_the_gates_start_from_the_initial_state_the_layer_is_called_with(kind):
    """``rnn(x, h0)`` (a GRU's tensor) or ``rnn(x, (h0, c0))`` inside the model: the recorded fraction is
    torch's own cell's from that state, not from zeros (over two time steps the first weighs half)."""
    rnn = _saturating(kind)
    x, h0 = torch.randn(20, 2, 5), 3 * torch.randn(1, 20, 7)
    state = (h0, 3 * torch.randn(1, 20, 7)) if kind is nn.LSTM else h0
    expected = _cell_reference(rnn, x, state)[0]
    assert abs(expected - _cell_reference(rnn, x)[0]) > 0.02  # the initial state matters here
    assert _recorded(rnn, x, state)["saturated"] == pytest.approx(expected, abs=2e-3)


@pytest.mark.parametrize("given", [True, False], ids=["with a state", "from zeros"])
@pytest.mark.parametrize("kind, options", [
    (nn.LSTM, {"num_layers": 2, "bidirectional": True}),
    (nn.LSTM, {"proj_size": 3}),
    (nn.GRU, {"num_layers": 2, "bidirectional": True}),
    (nn.LSTM, {"batch_first": False, "num_layers": 2}),
    (nn.LSTM, {"unbatched": True, "proj_size": 3}),
    (nn.GRU, {"unbatched": True, "num_layers": 2}),
    (nn.GRU, {"bias": False}),
])
def test_the_recomputed_recurrence_is_the_modules_own(kind, options, given):
    """Stacked, bidirectional, projected, sequence-first and unbatched (one sequence ``[T, features]``) layers,
    with a given initial state or from zeros: the recomputed last layer's sequence equals the module's output
    (so every gate along the way is right)."""
    from cockpit_lite.quantities.activation_stats import recurrent_gates

    torch.manual_seed(1)
    options = dict(options)
    unbatched = options.pop("unbatched", False)
    rnn = kind(4, 6, **options)
    batch_first = options.get("batch_first", True)
    if batch_first:
        rnn.batch_first = True
    x = torch.randn(5, 4) if unbatched else torch.randn(3, 5, 4) if batch_first else torch.randn(5, 3, 4)
    layers = options.get("num_layers", 1) * (2 if options.get("bidirectional") else 1)
    batch = () if unbatched else (3,)
    h0 = torch.randn(layers, *batch, options.get("proj_size") or 6)
    state = ((h0, torch.randn(layers, *batch, 6)) if kind is nn.LSTM else h0) if given else None
    output, saturated = recurrent_gates(rnn, x, state)
    expected = rnn(x, state)[0].detach()
    expected = expected.unsqueeze(0) if unbatched else expected if batch_first else expected.transpose(0, 1)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)
    assert 0 <= float(saturated) <= 1


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_the_gates_fraction_in_the_tails_is_exact(kind):
    """Zero weights and biases that put chosen gates in the tails: LSTM ``i = σ(10)``, ``f = σ(0)``, ``g = tanh(0)``,
    ``o = σ(−10)``: 2 of 4 gate values; GRU ``r = σ(10)``, ``z = σ(0)``, ``n = tanh(10)``: 2 of 3; the same at every
    step and sample (2 sequences of 3 steps)."""
    from cockpit_lite.quantities.activation_stats import recurrent_gates

    rnn = kind(2, 1, batch_first=True)
    with torch.no_grad():
        for p in rnn.parameters():
            p.zero_()
        rnn.bias_ih_l0.copy_(torch.tensor([10.0, 0.0, 0.0, -10.0] if kind is nn.LSTM else [10.0, 0.0, 10.0]))
    _, saturated = recurrent_gates(rnn, torch.randn(2, 3, 2))
    assert float(saturated) == (0.5 if kind is nn.LSTM else pytest.approx(2 / 3))


def test_a_recurrent_layer_on_a_packed_sequence_is_measured_on_its_entries():
    """``rnn(pack_padded_sequence(...))``: mean, std and zeros of the packed output's entries (time-major), NaN
    saturation (the gates are not recomputed)."""
    from torch.nn.utils.rnn import pack_padded_sequence

    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.LSTM(3, 5, batch_first=True), nn.Linear(5, 2)

        def forward(self, x):
            out, (h, _) = self.rnn(pack_padded_sequence(x, [4, 3, 2], batch_first=True))
            return self.head(h[-1])

    torch.manual_seed(0)
    model = Packed()
    x = torch.randn(3, 4, 3)
    packed = model.rnn(pack_padded_sequence(x, [4, 3, 2], batch_first=True))[0].data.detach().double().numpy()
    cp = Cockpit(model, [ActivationStats()], diagnose=False)
    loss = model(x).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    stats = cp.output[0]["ActivationStats"]["rnn"]
    assert packed.shape == (9, 5) and stats["type"] == "LSTM" and math.isnan(stats["saturated"])
    assert stats["mean"] == pytest.approx(packed.mean(), rel=1e-5) and stats["std"] == pytest.approx(packed.std(), rel=1e-4)
    assert stats["zeros"] == 0.0 and stats["dead"] is None


def test_a_recurrent_layer_called_by_keyword_is_not_recorded():
    """``rnn(input=x)``: the hook sees no positional input to recompute the gates from; the layer is left out
    (the user's forward pass runs on), the activation after it recorded."""

    class Keyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.act, self.head = nn.GRU(3, 5, batch_first=True), nn.Tanh(), nn.Linear(5, 2)

        def forward(self, x):
            return self.head(self.act(self.rnn(input=x)[0][:, -1]))

    torch.manual_seed(0)
    model = Keyword()
    cp = Cockpit(model, [ActivationStats()], diagnose=False)
    loss = model(torch.randn(4, 3, 3)).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert list(cp.output[0]["ActivationStats"]) == ["act"]


def test_the_gates_tails_exclude_their_bound():
    """A sigmoid gate of exactly ``SATURATION`` and a tanh candidate of exactly ±``SATURATION`` are not in the
    tails; just past them they are."""
    from cockpit_lite.quantities.activation_stats import _tails

    above = SATURATION + 1e-6
    assert int(_tails(torch.tensor([SATURATION, 0.5, above, 1 - above], dtype=torch.float64), "sigmoid")) == 2
    assert int(_tails(torch.tensor([SATURATION, -SATURATION, above, -above], dtype=torch.float64), "tanh")) == 2


class _LSTMReadout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.lstm(x)[0][:, -1]))


def test_the_engines_rerun_of_a_module_is_not_taken_for_the_users_forward_pass():
    """An LSTM's individual gradients come from a torch.func re-run of the module: the signals'
    forward hooks must not keep its vmapped tensors (it once broke the next forward pass of the
    user's training with 'your tensor may have escaped from inside a function being vmapped')."""
    import warnings

    from cockpit_lite import Cockpit
    from cockpit_lite.quantities import NormTest

    torch.manual_seed(0)
    model = _LSTMReadout()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [NormTest()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*performance drop.*")  # torch: no vmap rule for mkldnn_rnn_layer
        for step in range(4):
            x, y = torch.randn(6, 4, 3), torch.randint(0, 2, (6,))
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            opt.step()
    record = cp.get_output()
    assert all(math.isfinite(record[s]["NormTest"]) for s in range(4))
    stats = record[0]["ActivationStats"]
    assert set(stats) >= {"lstm"} and math.isfinite(stats["lstm"]["mean"])


@pytest.mark.parametrize("seed", range(5))
def test_std_of_outputs_far_from_zero(seed):
    """A sigmoid saturated near 1 (|mean| / std ≈ 7·10⁴) and a SiLU behind a large bias (≈ 10⁴): std against
    numpy on the same float32 outputs, to 10⁻⁴ relative (the second moment ``⟨y, y⟩ / n − mean²`` in float32 gave
    0 or several times the std)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 64), nn.Sigmoid(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))
    with torch.no_grad():
        model[0].weight.mul_(1e-2)
        model[0].bias.fill_(6.0)
        model[2].weight.mul_(1e-1)
        model[2].bias.fill_(100.0)
    outputs = {}
    for name in ("1", "3"):
        model.get_submodule(name).register_forward_hook(
            lambda mod, a, out, name=name: outputs.__setitem__(name, out.detach().double().numpy()))
    cp = Cockpit(model, [ActivationStats()], diagnose=False)
    loss = model(torch.randn(64, 8)).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    stats = cp.output[0]["ActivationStats"]
    for name, ratio in (("1", 3e4), ("3", 1e3)):
        y = outputs[name]
        assert abs(y.mean()) / y.std() > ratio
        assert stats[name]["std"] == pytest.approx(y.std(), rel=1e-4), name
        assert stats[name]["mean"] == pytest.approx(y.mean(), rel=1e-6), name


def test_the_ranks_std_of_outputs_far_from_zero():
    """The ranks' sums (float64) at |mean| / std = 10⁹: the parts' squared deviations from their own means with
    the spread of those means, against numpy (a sum of squares in float64 lost the std entirely)."""
    y = 1e6 + 1e-3 * torch.randn(20, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    stats = _global_statistics([_partial(y[:13], "gelu"), _partial(y[13:], "gelu")], "gelu")
    assert stats[1].item() == pytest.approx(y.numpy().std(), rel=1e-4)
    assert stats[0].item() == pytest.approx(y.numpy().mean(), rel=1e-7)
