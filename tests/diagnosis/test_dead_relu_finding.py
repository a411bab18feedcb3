"""``dead_relu`` is decided on batches large enough to tell a dead unit from one that did not fire by chance."""

import logging

import pytest
import torch
from torch import nn

import cockpit_lite
from cockpit_lite.diagnosis import Diagnosis

logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)


def findings(batch, bias=0.0, steps=12):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 3))
    with torch.no_grad():
        model[0].bias.fill_(bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cp = cockpit_lite.Cockpit(model)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x, y = torch.randn(batch, 6, generator=g), torch.randint(0, 3, (batch,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    cp.close()
    return [f.kind for f in cp.findings]


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_a_healthy_relu_layer_at_a_tiny_batch_is_not_dead(batch):
    """About half of a healthy ReLU layer's units are off for any one sample: at batch 1 they
    "never fired in the batch" (42-61 % of this layer's 64 units, before ``DEAD_MIN_SAMPLES``)."""
    assert "dead_relu" not in findings(batch)


def test_dead_units_are_still_found_at_an_ordinary_batch():
    assert "dead_relu" in findings(32, bias=-4.0)


def test_the_message_quotes_the_dead_share_of_the_named_step():
    """Hand-made records: 60 %, 70 %, 80 % dead; the finding names step 0 and its 60 %."""
    diagnosis = Diagnosis()
    for step, dead in enumerate([0.6, 0.7, 0.8]):
        diagnosis.feed(step, {"ActivationStats": {"act": {"dead": dead, "type": "ReLU"}}})
    (finding,) = [f for f in diagnosis.findings if f.kind == "dead_relu"]
    assert finding.step == 0 and "'act' (ReLU): 60% of its units" in finding.message, finding.message
