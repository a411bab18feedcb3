"""Severity means something: ``error`` breaks training, ``warning`` costs accuracy, ``info`` is an oddity.

Raw 0..255 pixels into a network whose first layer is BatchNorm train as well as normalised ones
(the layer removes the scale): at most an ``info`` note, and no warning or error on that healthy run.
"""

import logging

import pytest
import torch
from torch import nn

import cockpit_lite
from cockpit_lite.diagnosis import Finding
from experiments.common import load_digits_tensors

logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)


def train_digits(model, steps=40, lr=0.05):
    torch.manual_seed(0)
    (x, y), (xv, yv) = load_digits_tensors(seed=0, scaling="raw255")
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    cp = cockpit_lite.Cockpit(model)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        index = torch.randint(0, len(x), (32,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[index]), y[index])
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    cp.close()
    with torch.no_grad():
        model.eval()
        accuracy = float((model(xv).argmax(1) == yv).float().mean())
    return cp.findings, accuracy


@pytest.mark.parametrize("norm", [lambda: nn.BatchNorm2d(1), lambda: nn.Sequential(nn.Flatten(), nn.BatchNorm1d(64))])
def test_raw_pixels_into_a_first_batchnorm_are_an_info_note(norm):
    torch.manual_seed(0)
    model = nn.Sequential(norm(), nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    findings, accuracy = train_digits(model)
    assert accuracy > 0.85  # healthy: the scale costs nothing
    assert [(f.kind, f.severity) for f in findings] == [("unnormalized_inputs", "info")], findings
    assert "normalises" in findings[0].message


def test_raw_pixels_into_a_first_linear_layer_stay_a_warning():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    findings, _ = train_digits(model, steps=12, lr=1e-4)
    hit = [f for f in findings if f.kind == "unnormalized_inputs"]
    assert hit and hit[0].severity == "warning"


def test_info_is_a_severity():
    assert Finding("unnormalized_inputs", None, 0, "info", "m", "s").severity == "info"
    with pytest.raises(ValueError):
        Finding("unnormalized_inputs", None, 0, "notice", "m", "s")
