"""``edge_of_stability``'s severity on hand-made records: ``info`` while the median of the last
3 losses is below ``LEARNING`` (0.9) L₀ (L₀: the median of the first 3), ``warning`` otherwise."""

import pytest

from cockpit_lite.diagnosis import Diagnosis


@pytest.mark.parametrize("losses, severity", [
    # L₀ = 2; the last 3 losses' median 1.6 < 1.8 (the last 4's would be 1.8, not below)
    ([2.0, 2.0, 2.0, 1.6, 1.6], "info"),
    # the median 1.8 equals 0.9 · 2 (both exact: doubling 0.9 is exact): not below
    ([2.0, 2.0, 2.0, 1.8, 1.8], "warning"),
    ([2.0, 2.0, 2.0, 2.5, 2.5], "warning"),
])
def test_severity_says_whether_the_loss_still_falls(losses, severity):
    """η = 0.5, plain SGD: λ_max 1 (η λ = 0.5 < 2) for three records, then 6 (3 ≥ 2) twice:
    confirmed at step 4; the rate that would be stable: 2 / 6."""
    diagnosis = Diagnosis(names=["w"], shapes=[(1, 5)])
    presence = {"lr": 0.5, "optimizer": "SGD", "momentum": 0.0}
    for step, (loss, sharpness) in enumerate(zip(losses, [1.0, 1.0, 1.0, 6.0, 6.0])):
        diagnosis.feed(step, {"Loss": loss, "HessMaxEV": sharpness, "GradPresence": presence})
    (finding,) = [f for f in diagnosis.findings if f.kind == "edge_of_stability"]
    assert finding.step == 3 and finding.severity == severity
    assert "lower the learning rate below 0.33 if" in finding.suggestion


@pytest.mark.parametrize("sharpness, found", [(5.0, False), (8.0, True)])
def test_momentum_raises_the_limit_to_2_times_1_plus_beta(sharpness, found):
    """SGD with momentum β = 0.5, η = 0.5: the limit is 2(1 + β) = 3. η λ = 2.5 (λ = 5) is above plain SGD's 2 but
    below 3: nothing; η λ = 4 (λ = 8) at steps 3 and 4: found at step 3, with this evidence."""
    diagnosis = Diagnosis(names=["w"], shapes=[(1, 5)])
    presence = {"lr": 0.5, "optimizer": "SGD", "momentum": 0.5}
    for step, lam in enumerate([1.0, 1.0, 1.0, sharpness, sharpness]):
        diagnosis.feed(step, {"Loss": 2.0, "HessMaxEV": lam, "GradPresence": presence})
    evidence = {"lr": 0.5, "lambda_max": 8.0, "product": 4.0, "limit": 3.0, "step_confirmed": 4, "product_confirmed": 4.0}
    assert [(f.step, f.evidence) for f in diagnosis.findings if f.kind == "edge_of_stability"] == \
        ([(3, evidence)] if found else [])


@pytest.mark.parametrize("optimizer, found", [("SGD", True), (None, True), ("Adam", False), ("AdamW", False)])
def test_only_sgd_is_judged(optimizer, found):
    """η λ_max = 3 ≥ 2 on two records: the limit is SGD's (an optimizer not recorded counts as SGD); Adam's
    step is not η g, so the rule says nothing for it."""
    diagnosis = Diagnosis(names=["w"], shapes=[(1, 5)])
    presence = {"lr": 0.5, "optimizer": optimizer, "momentum": 0.0}
    for step in range(2):
        diagnosis.feed(step, {"Loss": 2.0, "HessMaxEV": 6.0, "GradPresence": presence})
    assert bool([f for f in diagnosis.findings if f.kind == "edge_of_stability"]) is found


def test_a_logged_learning_rate_stands_in_for_grad_presence():
    """No GradPresence (a log of another tool, or a Cockpit without the diagnosis' signals): ``cp.log``'s
    learning_rate 0.5 is read, the optimizer counts as SGD; λ_max 6, then 7: η λ = 3, then 3.5 ≥ 2, found at step 0."""
    diagnosis = Diagnosis(names=["w"], shapes=[(1, 5)])
    for step, lam in enumerate([6.0, 7.0]):
        diagnosis.feed(step, {"Loss": 2.0, "HessMaxEV": lam, "learning_rate": 0.5})
    (finding,) = [f for f in diagnosis.findings if f.kind == "edge_of_stability"]
    assert finding.step == 0 and finding.evidence["lr"] == 0.5 and finding.evidence["product"] == 3.0
    assert finding.message == ("lr * lambda_max = 0.5 * 6 = 3 >= 2 (the stability limit 2(1+momentum)) at step 0, "
                               "and 3.5 at step 1: the step size is at the edge of stability")


def test_a_product_exactly_at_the_limit_is_found():
    """η = 0.5, λ_max = 4 on two records: η λ = 2, the limit 2 of plain SGD, included."""
    diagnosis = Diagnosis(names=["w"], shapes=[(1, 5)])
    for step in range(2):
        diagnosis.feed(step, {"Loss": 2.0, "HessMaxEV": 4.0,
                              "GradPresence": {"lr": 0.5, "optimizer": "SGD", "momentum": 0.0}})
    assert [f.step for f in diagnosis.findings if f.kind == "edge_of_stability"] == [0]


def test_a_non_finite_sharpness_is_not_judged():
    """λ_max NaN (a failed Lanczos run) on every record, at a known learning rate: nothing to compare, no finding."""
    diagnosis = Diagnosis(names=["w"], shapes=[(1, 5)])
    for step in range(4):
        diagnosis.feed(step, {"Loss": 2.0, "HessMaxEV": float("nan"),
                              "GradPresence": {"lr": 0.5, "optimizer": "SGD", "momentum": 0.0}})
    assert not [f for f in diagnosis.findings if f.kind == "edge_of_stability"] and diagnosis.failures == []
