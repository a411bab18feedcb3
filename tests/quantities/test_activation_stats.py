"""``ActivationStats`` against numpy (float64) on the module outputs of the same forward pass."""

import numpy as np
import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import ActivationStats
from cockpit_lite.quantities.activation_stats import SATURATION, SUB_BATCH


def reference(y, kind):
    y = np.asarray(y, dtype=np.float64)
    sub = y[:SUB_BATCH]
    out = {"mean": y.mean(), "std": y.std(), "zeros": np.mean(sub == 0)}
    out["dead"] = 1 - np.mean((y > 0).any(axis=0)) if kind == "relu" else None
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
        out.detach().numpy().copy())) for m in model.modules() if isinstance(m, (nn.ReLU, nn.Tanh, nn.Sigmoid))]
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
    assert list(stats) == ["1", "3", "5"]
    for name, kind in (("1", "relu"), ("3", "tanh"), ("5", "sigmoid")):
        ref = reference(outputs[name][0], kind)
        assert stats[name]["type"] == {"relu": "ReLU", "tanh": "Tanh", "sigmoid": "Sigmoid"}[kind]
        for key, value in ref.items():
            if value is None:
                assert stats[name][key] is None
            else:
                assert stats[name][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, key)
    assert 0 < stats["1"]["dead"] < 1 and stats["3"]["saturated"] > 0.05


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
