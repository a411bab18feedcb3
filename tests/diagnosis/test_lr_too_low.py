"""``lr_too_low``: never on a loss worse than at the start; found late, within 30 steps of a
learning-rate collapse mid-run; not on the tail of a smooth schedule or one healthy step decay."""

import logging

import pytest
import torch
from torch import nn

import cockpit_lite
from cockpit_lite.diagnosis import Diagnosis
from experiments.common import load_digits_tensors

logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)


def test_a_diverging_loss_is_not_a_too_small_step():
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    for step in range(20):
        loss = 8.23 * (1.15 ** step)  # 8.23 -> ~100: worse than at the start
        diagnosis.feed(step, {"Loss": loss, "ParamNorm": [10.0, 5.0], "UpdateSize": [1e-4, 1e-4],
                              "GradNorm": [0.1, 0.1]})
    assert "lr_too_low" not in {f.kind for f in diagnosis.findings}


def train(schedule, steps=100, seed=0):
    """An MLP on digits, SGD 0.05 with momentum, ``schedule(opt)`` stepped after every batch."""
    torch.manual_seed(seed)
    (x, y), _ = load_digits_tensors(seed=seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = schedule(opt)
    cp = cockpit_lite.Cockpit(model)
    g = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        index = torch.randint(0, len(x), (32,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[index]), y[index])
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
    cp.close()
    emitted = {f["kind"]: s for s, e in cp.get_output().items() for f in e.get("findings", [])}  # recorded at
    return cp.findings, emitted


@pytest.mark.parametrize("seed", [0, 1])
def test_a_per_epoch_multistep_schedule_stepped_every_batch_is_found_within_30_steps(seed):
    # milestones meant in epochs (30, 40 of 50), stepped every batch: lr / 100 from step 40 on
    findings, emitted = train(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [30, 40], 0.1), seed=seed)
    hits = [f for f in findings if f.kind == "lr_too_low"]
    assert hits, findings
    assert emitted["lr_too_low"] <= 30 + 30 and hits[0].severity == "warning"
    assert not [f for f in findings if f.severity == "error"], findings


@pytest.mark.parametrize("schedule", [
    lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 100),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.05, total_steps=100),
    lambda o: torch.optim.lr_scheduler.StepLR(o, 50, 0.1),
    lambda o: None,
])
def test_healthy_schedules_are_not_flagged(schedule):
    findings, _ = train(schedule)
    assert findings == [], findings
