"""``missing_zero_grad`` under gradient accumulation: decided from the gradients the first micro-batch's
backward pass of an optimizer step finds, not from those the current accumulation legitimately holds."""

import logging

import pytest
import torch
from torch import nn

import cockpit_lite
from cockpit_lite.diagnosis import Diagnosis

logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)


def accumulate(zero_grad, micro=4, steps=6, where="last", zero_after_forward=False):
    """Accumulation over ``micro`` micro-batches, ``cp(step)`` around the ``where`` micro-batch's backward
    (``"every"``: around each, ``Cockpit(accumulate=True)``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cp = cockpit_lite.Cockpit(model, accumulate=where == "every")
    tracked = micro - 1 if where == "last" else 0
    for step in range(steps):
        if zero_grad and not zero_after_forward:
            opt.zero_grad()
        for k in range(micro):
            x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
            loss = nn.functional.cross_entropy(model(x), y) / micro
            if zero_grad and zero_after_forward and k == 0:
                opt.zero_grad()  # after the forward pass, before the backward: also right
            if k == tracked or where == "every":
                with cp(step, info={"loss": loss, "optimizer": opt}):
                    loss.backward()
            else:
                loss.backward()
        opt.step()
    cp.close()
    return [f.kind for f in cp.findings]


@pytest.mark.parametrize("where", ["last", "first", "every"])
def test_accumulation_done_right_is_not_a_missing_zero_grad(where):
    assert "missing_zero_grad" not in accumulate(True, where=where)


def test_zero_grad_between_forward_and_backward_is_right_too():
    assert "missing_zero_grad" not in accumulate(True, zero_after_forward=True)


@pytest.mark.parametrize("where", ["last", "first", "every"])
def test_accumulation_without_zero_grad_is_found(where):
    assert "missing_zero_grad" in accumulate(False, where=where)


def test_no_accumulation_without_zero_grad_is_found_at_the_first_update():
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    cp = cockpit_lite.Cockpit(model)
    for step in range(5):
        loss = model(torch.randn(8, 5)).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    cp.close()
    found = [f for f in cp.findings if f.kind == "missing_zero_grad"]
    assert [f.step for f in found] == [1]


def _found(presences):
    diagnosis = Diagnosis()
    for step, presence in enumerate(presences):
        diagnosis.feed(step, {"GradPresence": presence})
    return [f for f in diagnosis.findings if f.kind == "missing_zero_grad"]


def test_hand_made_records_quote_the_gradients_the_first_backward_found():
    (finding,) = _found([{"first_backward": 0.7, "before": 0.2, "after": 0.9, "stepped": 1}] * 2)
    assert finding.step == 0
    assert finding.evidence == {"held": 0.7, "before": 0.2, "after": 0.9, "stepped": 1}
    assert "the parameters still held (norm 0.7) from batches that update had already used" in finding.message
    assert finding.suggestion.startswith("call optimizer.zero_grad() (or model.zero_grad()) once per optimizer step")


@pytest.mark.parametrize("before, stepped, found", [
    (0.5, 1, True),    # gradients held across an optimizer step
    (0.5, 0, False),   # no optimizer step since the previous context: accumulation
    (0.0, 1, False),   # zeroed
])
def test_logs_without_first_backward_fall_back_on_before_and_a_step(before, stepped, found):
    hits = _found([{"before": before, "after": before + 1.0, "stepped": stepped}] * 3)
    assert bool(hits) is found
    if found:
        assert hits[0].step == 0 and hits[0].evidence["held"] == before and hits[0].evidence["after"] == 1.5
