"""``GradPresence``: the norm of the gradients present before backward (brute force: the gradients held
then), this pass's own norm, and the optimizer steps counted between two contexts."""

import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import GradPresence


def test_before_after_and_stepped_without_zero_grad():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    cp = Cockpit(model, [GradPresence()], diagnose=False)
    held, own = [], []
    for step in range(3):  # no zero_grad: gradients accumulate
        x = torch.randn(8, 5)
        held.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm().item()
                    if step else 0.0)
        loss = model(x).square().mean()
        grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
        own.append(torch.cat([g.reshape(-1) for g in grads]).norm().item())
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    for step in range(3):
        value = cp.output[step]["GradPresence"]
        assert value["before"] == pytest.approx(held[step], rel=1e-5)
        assert value["after"] == pytest.approx(own[step], rel=1e-5)
        assert value["stepped"] == (None if step == 0 else 1)
        assert (value["optimizer"], value["lr"], value["momentum"]) == ("SGD", 0.1, 0.5)


def test_steps_are_counted_on_untracked_steps_too():
    model = nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    cp = Cockpit(model, [GradPresence(track_schedule=lambda s: s in (0, 4))], diagnose=False)
    for step in range(5):
        opt.zero_grad()
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
        if step == 2:
            opt.step()  # two updates between the contexts of steps 2 and 3
    value = cp.output[4]["GradPresence"]
    assert value["stepped"] == 1 and value["before"] == 0  # since step 3's context, not since step 0
    assert value["optimizer"] == "Adam" and value["momentum"] == 0.9
