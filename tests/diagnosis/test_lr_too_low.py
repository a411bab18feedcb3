"""``lr_too_low``: never on a loss worse than at the start; found late, within 30 steps of a
learning-rate collapse mid-run (step decays too close together, one drop of 1e4, a per-batch exponential
decay); not on the tail of a smooth schedule, one healthy step decay or a staircase of decays far apart."""

import logging
import math

import pytest
import torch
from torch import nn

import cockpit_lite
from cockpit_lite.diagnosis import Diagnosis
from cockpit_lite.diagnosis.rules.lr_too_low import SCHEDULE, SUGGESTION
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


@pytest.mark.parametrize("schedule, onset", [
    (lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [40], 1e-4), 40),  # a gamma of 1e-4: in one step
    (lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.9), 33),  # per epoch, stepped every batch: smoothly
], ids=["milestone_gamma_1e-4", "exponential_per_batch"])
def test_a_rate_that_collapses_in_one_step_or_decays_to_almost_nothing_is_found_within_30_steps(schedule, onset):
    findings, emitted = train(schedule)
    hits = [f for f in findings if f.kind == "lr_too_low"]
    assert hits, findings
    assert emitted["lr_too_low"] <= onset + 30 and hits[0].severity == "warning"


@pytest.mark.parametrize("schedule", [
    lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 100),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.05, total_steps=100),
    lambda o: torch.optim.lr_scheduler.StepLR(o, 50, 0.1),
    lambda o: torch.optim.lr_scheduler.StepLR(o, 30, 0.1),  # a staircase to lr / 1000: decays far apart
    lambda o: None,
])
def test_healthy_schedules_are_not_flagged(schedule):
    findings, _ = train(schedule)
    assert findings == [], findings


def synthetic(lrs, ratio_of_lr=0.1, loss=lambda s: 0.7 + 1.6 * math.exp(-s / 50)):
    """Findings of a run whose records (every 10 steps after the first 10) have the learning rates ``lrs(step)``,
    updates ``ratio_of_lr`` * lr of the weights' norm and the loss ``loss(step)`` (by default it learns);
    ``(findings, {kind: step raised})``."""
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    raised = {}
    for step in [*range(10), *range(10, 400, 10)]:
        lr = lrs(step)
        entry = {"Loss": loss(step), "ParamNorm": [10.0, 5.0], "GradNorm": [0.1, 0.1], "GradPresence": {"lr": lr},
                 "UpdateSize": [10.0 * ratio_of_lr(lr) if callable(ratio_of_lr) else 10.0 * ratio_of_lr * lr,
                                5.0 * (ratio_of_lr(lr) if callable(ratio_of_lr) else ratio_of_lr * lr)]}
        for f in diagnosis.feed(step, entry)[0]:
            raised.setdefault(f.kind, step)
    assert diagnosis.failures == []  # no rule failed (and was switched off) on these records
    return diagnosis.findings, raised


def cosine(horizon, peak=0.1):
    return lambda s: peak * 0.5 * (1 + math.cos(math.pi * min(s, horizon) / horizon))


def test_the_end_of_a_smooth_schedule_is_not_flagged_a_decay_that_ends_early_is():
    """Cosine to 0 over 390 steps: below 1/30 of the peak for its last 12 % (not a quarter of the run before it);
    the same cosine over 100 steps, then 290 steps at a rate near 0: found."""
    assert synthetic(lambda s: max(cosine(390)(s), 1e-9))[0] == []
    findings, raised = synthetic(lambda s: max(cosine(100)(s), 1e-7))
    assert [f.kind for f in findings] == ["lr_too_low"] and raised["lr_too_low"] <= 90 + 30, findings


def test_a_warm_up_is_small_on_purpose():
    """A linear warm-up over 400 steps from 1e-6: tiny updates and a flat loss while the rate rises."""
    assert synthetic(lambda s: 1e-6 + 1e-3 * s / 400, ratio_of_lr=0.01, loss=lambda s: 2.3)[0] == []


def test_a_rate_collapse_the_updates_do_not_follow_is_not_flagged():
    """The first parameter group's rate (what GradPresence reads) drops 1e4x; the updates stay as they were."""
    assert synthetic(lambda s: 0.1 if s < 100 else 1e-5, ratio_of_lr=lambda lr: 1e-3)[0] == []


def test_after_a_warm_restart_a_later_collapse_is_named_at_its_own_step():
    """SGDR: a cosine to 1e-7 over 100 steps, restarted at 100; a milestone with gamma 1e-4 at step 250."""
    def lrs(s):
        return 1e-5 if s >= 250 else max(cosine(100)(s % 100), 1e-7) if s < 100 else 0.1
    findings, raised = synthetic(lrs)
    hits = [f for f in findings if f.kind == "lr_too_low"]
    assert hits and hits[0].step == 250 and raised["lr_too_low"] <= 250 + 30, findings


def _late(lrs):
    hits = [f for f in synthetic(lrs)[0] if f.kind == "lr_too_low"]
    return [(f.step, f.evidence["how"]) for f in hits]


def test_step_decays_exactly_close_enough_together_are_found():
    """8x at step 20, 8x again at 30 (1/64 of the peak, below 1/30): 30 - 20 = 0.5 * 20, on the bound
    (``CLOSE_STEPS``, included); the updates (0.1 lr) fall 64x."""
    assert _late(lambda s: 1.0 if s < 20 else 0.125 if s < 30 else 1 / 64) == [(30, "in step decays at steps 20 and 30")]


def test_a_smooth_decay_counts_the_five_records_up_to_its_end_only():
    """The rate halves on each of the 5 records 40..80 (1/32 at 80, below 1/30 of the peak), after a flat
    start; found once the run went on 0.25 * 80 steps at the updates of 1/32: raised at step 100, where
    100 - 80 = 0.25 * 80 is on the bound (``STALL_SHARE``, included)."""
    def lrs(s):
        return 1.0 if s < 40 else 2.0 ** -min((s - 30) // 10, 5)
    assert _late(lrs) == [(80, "smoothly")]
    assert synthetic(lrs)[1]["lr_too_low"] == 100


def test_a_collapse_after_three_records_is_found():
    """The rate falls 64x at step 3: three records of updates before it, the fewest that tell the usual size."""
    assert _late(lambda s: 1.0 if s < 3 else 1 / 64) == [(3, "in one step")]


def test_a_flat_loss_at_tiny_updates_from_the_start_quotes_them():
    """Loss 2.3 throughout, updates 1e-4 of the weights (below ``LOW_RATIO`` 3e-4): found after ``MIN_STEPS``
    (10) records, at step 9, with the numbers of the record."""
    findings, _ = synthetic(lambda s: 1e-3, loss=lambda s: 2.3)
    (finding,) = findings
    assert finding.kind == "lr_too_low" and finding.step == 9
    assert finding.evidence["update_ratio"] == pytest.approx(1e-4, rel=1e-9)
    assert finding.evidence["loss_ref"] == 2.3 and finding.evidence["loss"] == 2.3


def test_a_collapse_in_one_step_is_found_on_the_second_record_from_it():
    """The rate falls 64x at step 100 (records every 10 steps): the updates at 100 and 110 are the two that show
    it, raised at step 110."""
    findings, raised = synthetic(lambda s: 1.0 if s < 100 else 1 / 64)
    assert [(f.step, f.evidence["how"]) for f in findings if f.kind == "lr_too_low"] == [(100, "in one step")]
    assert raised["lr_too_low"] == 110


def test_two_records_before_a_collapse_tell_no_usual_update_size():
    assert _late(lambda s: 1.0 if s < 2 else 1 / 64) == []


def test_an_update_that_could_not_be_measured_is_left_out_of_the_updates_since_the_collapse():
    """As above, with the update of step 110 NaN: found at step 120 from the updates of 100 and 120, 1/64 of 0.1."""
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    for step in [*range(10), *range(10, 200, 10)]:
        lr = 1.0 if step < 100 else 1 / 64
        diagnosis.feed(step, {"Loss": 0.7 + 1.6 * math.exp(-step / 50), "ParamNorm": [10.0, 5.0], "GradNorm": [0.1, 0.1],
                              "GradPresence": {"lr": lr},
                              "UpdateSize": [math.nan, math.nan] if step == 110 else [lr, 0.5 * lr]})
    (found,) = [f for f in diagnosis.findings if f.kind == "lr_too_low"]
    assert found.evidence["update_ratio"] == pytest.approx(0.1 / 64, rel=1e-3)


def test_updates_exactly_30_times_smaller_than_before_the_collapse_are_found():
    """||θ|| = |(3, 4)| = 5; updates |(2.25, 3)| = 3.75 (0.75 of it) before the collapse at step 100, |(0.075, 0.1)|
    = 0.125 after (0.025 = 0.75 / 30 exactly): the bound, included."""
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    for step in [*range(10), *range(10, 200, 10)]:
        lr = 1.0 if step < 100 else 1 / 64
        diagnosis.feed(step, {"Loss": 0.7 + 1.6 * math.exp(-step / 50), "ParamNorm": [3.0, 4.0], "GradNorm": [0.1, 0.1],
                              "GradPresence": {"lr": lr}, "UpdateSize": [2.25, 3.0] if step < 100 else [0.075, 0.1]})
    assert [f.step for f in diagnosis.findings if f.kind == "lr_too_low"] == [100]


def test_the_usual_update_is_the_largest_median_of_3_consecutive_records_before_the_collapse():
    """Updates 0.1 of the weights before the collapse at step 100, 0.75 at steps 40 and 50: the largest 3-record
    median is 0.75 (a window of 4 records would give at most 0.425); 0.001 after."""
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    for step in [*range(10), *range(10, 200, 10)]:
        update = [2.25, 3.0] if step in (40, 50) else [0.3, 0.4] if step < 100 else [0.003, 0.004]
        diagnosis.feed(step, {"Loss": 0.7 + 1.6 * math.exp(-step / 50), "ParamNorm": [3.0, 4.0], "GradNorm": [0.1, 0.1],
                              "GradPresence": {"lr": 1.0 if step < 100 else 1 / 64}, "UpdateSize": update})
    (found,) = [f for f in diagnosis.findings if f.kind == "lr_too_low"]
    assert found.evidence["update_ratio_before"] == 0.75 and found.evidence["update_ratio"] == pytest.approx(1e-3)


def test_the_updates_since_the_collapse_are_the_median_of_the_last_3():
    """Momentum carries the updates down over records after the collapse at step 100: 0.5, 0.1, then 0.001 of the
    weights (0.75 before): the last 3 are 0.1, 0.001, 0.001 at step 130, where it is raised (their median 0.001 is
    below 0.75 / 30; the last 4's would still be 0.05)."""
    diagnosis, raised = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)]), []
    after = {100: 0.5, 110: 0.1}
    for step in [*range(10), *range(10, 200, 10)]:
        ratio = 0.75 if step < 100 else after.get(step, 0.001)
        raised += [step for f in diagnosis.feed(step, {
            "Loss": 0.7 + 1.6 * math.exp(-step / 50), "ParamNorm": [3.0, 4.0], "GradNorm": [0.1, 0.1],
            "GradPresence": {"lr": 1.0 if step < 100 else 1 / 64}, "UpdateSize": [3.0 * ratio, 4.0 * ratio]})[0]
            if f.kind == "lr_too_low"]
    assert raised == [130]


def test_the_late_finding_quotes_the_rates_and_the_updates_of_its_records():
    """The rate falls from 1 to 1/64 at step 100, then 0.01 at step 110 (100x below the peak there); the updates fall
    from 0.75 to 0.0247 of the weights, 30.4x."""
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    for step in [*range(10), *range(10, 200, 10)]:
        lr = 1.0 if step < 100 else 1 / 64 if step == 100 else 0.01
        diagnosis.feed(step, {"Loss": 0.7 + 1.6 * math.exp(-step / 50), "ParamNorm": [3.0, 4.0], "GradNorm": [0.1, 0.1],
                              "GradPresence": {"lr": lr}, "UpdateSize": [2.25, 3.0] if step < 100 else [0.0741, 0.0988]})
    (found,) = [f for f in diagnosis.findings if f.kind == "lr_too_low"]
    assert found.message == (
        "at step 100 the learning rate had fallen in one step to 0.0156 (from 1 on the record before; 1e+02x below its "
        "peak 1 by step 110); since then each step changes the weights by 0.025 of their norm, 30x less than before: "
        "training has all but stopped")
    assert found.suggestion == SCHEDULE + SUGGESTION
    assert found.evidence == {"lr_peak": 1.0, "lr": 0.01, "update_ratio": 0.0247, "update_ratio_before": 0.75,
                              "how": "in one step"}


def _from_the_start(lrs, loss=lambda s: 2.3, ratio=1e-5):
    """The step on which lr_too_low is raised for a loss ``loss(step)`` and updates of ``ratio`` of the weights (both
    flat by default: too small a step from the start), the rate ``lrs(step)`` (``None``: not logged)."""
    return synthetic(lrs, ratio_of_lr=lambda lr: ratio, loss=loss)[1].get("lr_too_low")


def test_a_rate_that_rose_on_the_last_record_is_a_warm_up():
    # rising to 5e-4 by step 4, flat after: judged at step 9, the first record with 10 losses
    assert _from_the_start(lambda s: 1e-4 * min(s + 1, 5)) == 9
    # the rate 1, 3, 2 (x 1e-4) over and over: at step 9 it fell from 3 to 2 (not a warm-up), at 10 it is 1
    assert _from_the_start(lambda s: 1e-4 * {1: 1, 2: 3, 0: 2}[s % 3]) == 9
    # logged from step 8 on only: 1e-4, then 2e-4 at step 9 (rising: a warm-up), flat at step 10
    assert _from_the_start(lambda s: None if s < 8 else 1e-4 if s == 8 else 2e-4) == 10


def test_no_finding_from_the_start_without_a_positive_loss_or_a_measured_update():
    assert _from_the_start(lambda s: 1e-3, loss=lambda s: -1.0) is None  # a negative loss (a Gaussian NLL): L0 < 0
    assert _from_the_start(lambda s: 1e-3, ratio=math.nan) is None  # updates that could not be measured


def test_the_finding_from_the_start_quotes_the_medians_of_the_last_5_records():
    """At step 9 the last 5 records (5-9) have losses 2.3, 2.3, 2.3, 2.4, 2.4 and updates 1, 1, 1, 2, 2 (x 1.234e-5):
    medians 2.3 and 1.234e-5 (with step 4's 2.4 and 2.468e-5, the last 6 would give 2.35 and 1.85e-5). L0 = 2.3."""
    odd = (4, 8, 9)
    findings, _ = synthetic(lambda s: 2e-3 if s in odd else 1e-3, ratio_of_lr=lambda lr: 0.01234 * lr,
                            loss=lambda s: 2.4 if s in odd else 2.3)
    (found,) = [f for f in findings if f.kind == "lr_too_low"]
    assert found.step == 9
    assert found.message == ("after 10 records (step 9) the loss moved only 0% (2.3 -> 2.3, medians) while each step "
                             "changed the weights by 1.2e-05 of their norm, although every layer gets a gradient")
    assert found.suggestion == SUGGESTION


def test_updates_of_exactly_3e_4_of_the_weights_are_not_too_small():
    """|(10, 5) 3e-4| / |(10, 5)| is 3e-4 exactly: the bound of LOW_RATIO belongs to the healthy side."""
    assert _from_the_start(lambda s: 1e-3, ratio=3e-4) is None
    assert _from_the_start(lambda s: 1e-3, ratio=2.9e-4) == 9


@pytest.mark.parametrize("loss, raised", [
    (lambda s: 0.5, 9),                         # a loss below 1 is judged as any other
    (lambda s: 0.0, None),                      # a loss of exactly 0: no L0 to measure a drop against
    (lambda s: 2.3 if s < 3 else 2.35, 9),      # up 2.2 % of L0: barely moved
    (lambda s: 20.0 if s < 3 else 18.0, None),  # down exactly 10 % of L0 (2 / 20): moved, the bound included
])
def test_the_loss_moved_by_less_than_10_percent_of_a_positive_l0(loss, raised):
    assert _from_the_start(lambda s: 1e-3, loss=loss) == raised


def test_the_finding_from_the_start_quotes_the_drop_in_percent_to_2_digits():
    """L0 = 2.5, then 2.29075: the loss moved (2.5 - 2.29075) / 2.5 = 8.37 %, quoted as 8.4 %."""
    findings, _ = synthetic(lambda s: 1e-3, ratio_of_lr=lambda lr: 1e-5, loss=lambda s: 2.5 if s < 3 else 2.29075)
    (found,) = [f for f in findings if f.kind == "lr_too_low"]
    assert "the loss moved only 8.4% (2.5 -> 2.29, medians)" in found.message, found.message


def test_step_decays_of_exactly_5x_count_and_a_rate_of_exactly_a_30th_of_its_peak_is_low():
    """Decays of exactly 5x (LATE_STEP, included) at steps 20, 30 and 40 (1/125 of the peak at 40, 10 steps after
    the one before): found in step decays. A rate of 1.5 that falls to exactly 1.5 / 30 at step 100: low (the
    bound, included), in one step."""
    assert _late(lambda s: 1.0 if s < 20 else 0.2 if s < 30 else 0.04 if s < 40 else 0.008) == \
        [(40, "in step decays at steps 30 and 40")]
    findings, _ = synthetic(lambda s: 1.5 if s < 100 else 0.05, ratio_of_lr=lambda lr: 0.1 * lr if lr > 0.1 else 1e-4)
    assert [(f.step, f.evidence["how"]) for f in findings if f.kind == "lr_too_low"] == [(100, "in one step")]


def test_a_smooth_decay_needs_five_records_of_decrease():
    """Updates 0.1 of the weights while the rate is above 0.05, 1e-4 below; the loss learns in the first 10 records
    (no finding from the start). From step 0 the rate halves on each of
    5 records (1/32 at step 5, below 1/30 of the peak): smoothly. Divided by 2.4 on each of 4 records (1/33.2 at
    step 4): the same fall in one record fewer, not a smooth decay, nor a step decay (2.4x < 5x) nor one step."""
    def run(lrs):
        return synthetic(lrs, ratio_of_lr=lambda lr: 0.1 if lr > 0.05 else 1e-4, loss=lambda s: 0.5 + 2 * math.exp(-s / 3))[0]
    halving = [f for f in run(lambda s: 2.0 ** -min(s, 5)) if f.kind == "lr_too_low"]
    assert [(f.step, f.evidence["how"]) for f in halving] == [(5, "smoothly")]
    assert 2.4 ** -4 <= 1 / 30 < 2.4 ** -3
    assert run(lambda s: 2.4 ** -min(s, 4)) == []


def test_a_smooth_decay_decreases_on_every_record():
    """1 up to step 30, then 0.5, 0.6, 0.2, 0.25 and 0.03 from step 80 on (below 1/30 of the peak; every other record
    decreases): not a smooth decay; 0.25 -> 0.03 is one step decay of 8.3x, the one before (0.6 -> 0.2) only 3x."""
    lrs = {40: 0.5, 50: 0.6, 60: 0.2, 70: 0.25}
    assert _late(lambda s: 1.0 if s < 40 else lrs.get(s, 0.03)) == []


def test_a_rate_held_at_0_is_one_decay_not_one_per_record():
    """1 up to step 30, 0 at 40 and 50 (the updates, of another parameter group, go on at 0.01 of the weights), 0.05
    at 60, 0.005 from 70 on (the updates 1/200 of before): the decays are at 40 and 70, 30 steps apart, more than half
    of 40; the rate back above 1/30 of its peak at 60 ended the first collapse. No finding."""
    lrs = {40: 0.0, 50: 0.0, 60: 0.05}
    findings, _ = synthetic(lambda s: 1.0 if s < 40 else lrs.get(s, 0.005),
                            ratio_of_lr=lambda lr: 0.01 if lr == 0 else 0.1 * lr)
    assert [f for f in findings if f.kind == "lr_too_low"] == []


def test_a_rate_that_was_0_whenever_it_was_logged_has_no_peak_to_fall_from():
    """No rate on the records before step 50 (updates 0.1 of the weights), 0 from 50 on (updates 1e-4): the rate
    never fell, so no late finding (the loss learns, so none from the start)."""
    findings, _ = synthetic(lambda s: None if s < 50 else 0.0, ratio_of_lr=lambda lr: 0.1 if lr is None else 1e-4)
    assert [f for f in findings if f.kind == "lr_too_low"] == []


@pytest.mark.parametrize("without_update, raised", [(1, 9), (2, 10)])
def test_the_finding_from_the_start_needs_10_losses_and_9_updates(without_update, raised):
    """A flat loss at updates 1e-5 of the weights, the first records without an update (a real run's first record
    has none: nothing moved before it). One: 10 losses and 9 updates at step 9, found there; two: 8 updates at step
    9, found at step 10."""
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    found = []
    for step in range(20):
        entry = {"Loss": 2.3, "ParamNorm": [10.0, 5.0], "GradNorm": [0.1, 0.1], "GradPresence": {"lr": 1e-3}}
        if step >= without_update:
            entry["UpdateSize"] = [1e-4, 5e-5]
        found += [step for f in diagnosis.feed(step, entry)[0] if f.kind == "lr_too_low"]
    assert found == [raised]


def test_a_step_fed_again_counts_its_learning_rate_once():
    """The smooth decay of ``test_a_smooth_decay_counts_the_five_records_up_to_its_end_only`` with every record
    fed twice (as a value logged later for a step already diagnosed feeds it again): the same rate twice is one
    record, and the decay is still smooth."""
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    for step in [*range(10), *range(10, 400, 10)]:
        lr = 1.0 if step < 40 else 2.0 ** -min((step - 30) // 10, 5)
        entry = {"Loss": 0.7 + 1.6 * math.exp(-step / 50), "ParamNorm": [10.0, 5.0], "GradNorm": [0.1, 0.1],
                 "GradPresence": {"lr": lr}, "UpdateSize": [lr, 0.5 * lr]}
        diagnosis.feed(step, entry)
        diagnosis.feed(step, entry)
    assert [(f.step, f.evidence["how"]) for f in diagnosis.findings if f.kind == "lr_too_low"] == [(80, "smoothly")]


@pytest.mark.parametrize("grads", [[0.1, 0.0], [0.1, math.inf], [math.nan, 0.1]], ids=["zero", "inf", "nan"])
def test_a_record_where_a_layer_has_no_finite_positive_gradient_is_not_judged(grads):
    """A flat loss at updates 1e-5 of the weights, found at step 9; with step 9's gradient of one layer 0 (no
    gradient: vanishing or frozen, not the step size), inf (a GradScaler overflow) or NaN, found at step 10."""
    diagnosis = Diagnosis(names=["w", "v"], shapes=[(4, 4), (2, 4)])
    found = []
    for step in range(20):
        entry = {"Loss": 2.3, "ParamNorm": [10.0, 5.0], "GradNorm": grads if step == 9 else [0.1, 0.1],
                 "GradPresence": {"lr": 1e-3}, "UpdateSize": [1e-4, 5e-5]}
        found += [step for f in diagnosis.feed(step, entry)[0] if f.kind == "lr_too_low"]
    assert found == [10]


def test_a_run_that_never_logs_a_learning_rate_is_judged_from_the_start_only():
    """No rate on any record: a learning loss gives no finding (and the rule does not fail: ``synthetic`` checks
    it); a flat loss at tiny updates is found from the start."""
    assert synthetic(lambda s: None, ratio_of_lr=lambda lr: 0.01)[0] == []
    assert _from_the_start(lambda s: None) == 9
