"""``ParamNorm`` against numpy: ``‖θ‖₂`` of every tensor at the step's start."""

import numpy as np
import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import ParamNorm


def test_against_numpy_before_the_update():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(12, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cp = Cockpit(model, [ParamNorm()], diagnose=False)
    for step in range(2):
        expected = [np.linalg.norm(p.detach().double().numpy()) for p in model.parameters()]
        opt.zero_grad()
        loss = model(torch.randn(4, 2, 4, 4)).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
        opt.step()
        assert cp.output[step]["ParamNorm"] == pytest.approx(expected, rel=1e-6)
