"""``noise_dominates``: no "inf x the batch size" or "~1e+06" advice when the noise explains all of
the gradient's norm; the quoted factor where the ratio is meaningful."""

import math

import pytest

from cockpit_lite.diagnosis import Diagnosis


def run(trace, squared, losses=None, batch=32):
    """Findings of 6 records of tr(Sigma) ``trace``, |g|^2 ``squared`` and batch size ``batch`` (one, or one per
    record); the window of 5 is full at step 4."""
    diagnosis = Diagnosis(names=["w"], shapes=[(4, 4)])
    sizes = batch if isinstance(batch, list) else [batch] * 6
    for step in range(6):
        loss = losses[step] if losses else 2.3
        diagnosis.feed(step, {"Loss": loss, "GradNorm": [math.sqrt(squared)], "GradVariance": [trace],
                              "batch": {"size": sizes[step]}})
    return [f for f in diagnosis.findings if f.kind == "noise_dominates"]


@pytest.mark.parametrize("trace, squared, explains, simple", [
    # |g|^2 = 2 equals tr(Sigma)/B up to sqrt's rounding: all or nearly all
    (64.0, 1.0, "explains all of", math.inf), (64.0, 2.0, "all of", None),
    # |G|^2 = 2 + 1e-7 - 64 / 32 = 1e-7: B_simple = 64 / 1e-7
    (64.0, 2.0 + 1e-7, "explains nearly all of", 6.4e8),
    # |g|^2 = 4 is exactly tr(Sigma)/B = 128 / 32: |G|^2 = 0, no division by it
    (128.0, 4.0, "explains all of", math.inf)])
def test_no_infinite_or_absurd_numbers_in_the_advice(trace, squared, explains, simple):
    found = run(trace, squared)  # tr(Sigma)/B = 2: the noise is (nearly) all of |g|^2
    assert len(found) == 1
    text = found[0].message + found[0].suggestion
    assert "inf" not in text and "e+0" not in text, text
    assert "not measurably different from zero" in found[0].message and explains in found[0].message
    if simple is not None:
        assert found[0].evidence["B_simple"] == pytest.approx(simple, rel=1e-3)
    assert found[0].evidence["batch_size"] == 32


def test_a_meaningful_ratio_is_quoted():
    found = run(64.0, 2.0 + 0.05)  # B_simple / B = 2 / (32 * 0.05) ... = 40
    assert len(found) == 1 and "40x the batch size" in found[0].message
    assert "towards ~1.3e+03" in found[0].suggestion


def test_severity_is_info_while_the_loss_falls():
    falling = [2.3, 2.2, 2.0, 1.5, 1.2, 1.0]
    assert run(64.0, 1.0, falling)[0].severity == "info"
    assert run(64.0, 1.0)[0].severity == "warning"


@pytest.mark.parametrize("losses, severity", [
    # L0 = 2; at step 4 the last 3 losses' median is 1.7 < 1.8 (the last 4's, 1.85, and the window's, 2, are not)
    ([2.0, 2.0, 2.0, 1.6, 1.7, 1.7], "info"),
    # the last 3 losses' median is 1.8, exactly 0.9 L0 (doubling 0.9 is exact): not below
    ([2.0, 2.0, 2.0, 1.8, 1.8, 1.8], "warning"),
])
def test_severity_reads_the_median_of_the_last_3_losses_below_0_9_times_the_first(losses, severity):
    (finding,) = run(64.0, 1.0, losses)
    assert finding.step == 0 and finding.severity == severity


@pytest.mark.parametrize("trace, squared, found", [
    # tr(Sigma)/B = 3520 / 32 = 110, |G|^2 = 121 - 110 = 11: B_simple / B = 3520 / (11 * 32) = 10 exactly, included
    (3520.0, 121.0, True), (3519.0, 121.0, False)])
def test_a_noise_scale_of_exactly_10_times_the_batch_is_found(trace, squared, found):
    assert len(run(trace, squared)) == found


def test_a_ratio_of_exactly_1000_is_still_quoted():
    """tr(Sigma)/B = 32032000 / 32 = 1001000, |G|^2 = 1001^2 - 1001000 = 1001: B_simple / B = 1000 exactly."""
    (finding,) = run(32032000.0, 1001.0 ** 2)
    assert finding.evidence["noise_over_batch"] == 1000.0
    assert "towards ~3.2e+04" in finding.suggestion, finding.suggestion


def test_the_window_s_batch_size_is_its_last_record_s_and_the_message_quotes_its_numbers():
    """Batches of 16, then 32 at step 4 (the window's last record): tr(Sigma)/B = 121 / 32 = 3.78125, |G|^2 = 4 -
    3.78125 = 0.21875, so B_simple / B = 121 / 7 = 17.29 and B_simple = 553.1 (at B = 16, |g|^2 is all noise)."""
    (finding,) = run(121.0, 4.0, batch=[16, 16, 16, 16, 32, 32])
    assert finding.message == ("the gradient noise scale B_simple = tr(Sigma)/|G|^2 is 17x the batch size (553 vs B = "
                               "32) over steps 0-4: each step follows mostly noise")
    assert finding.suggestion == ("increase the batch size towards ~5.5e+02 (or accumulate gradients), or lower the "
                                  "learning rate by ~17x")
    assert finding.evidence == {"noise_over_batch": 17.29, "B_simple": 553.1, "batch_size": 32}


def test_a_record_without_a_batch_size_is_left_out_of_the_window():
    """Step 2 has no batch size: the window of 5 records is steps 0, 1, 3, 4, 5."""
    diagnosis = Diagnosis(names=["w"], shapes=[(4, 4)])
    for step in range(6):
        entry = {"Loss": 2.3, "GradNorm": [1.0], "GradVariance": [64.0]}
        if step != 2:
            entry["batch"] = {"size": 32}
        diagnosis.feed(step, entry)
    (finding,) = [f for f in diagnosis.findings if f.kind == "noise_dominates"]
    assert finding.step == 0 and "over steps 0-5" in finding.message, finding.message


def test_the_message_of_a_noise_that_explains_nearly_all_quotes_both_parts():
    """tr(Sigma)/B = 32 / 32 = 1 and |g|^2 = 1.0009: |G|^2 = 0.0009, B_simple / B = 1 / (0.0009 * 32) = 1111 > 1000,
    too large to quote; the squared norm is 1 + 0.0009 (3 digits: 1)."""
    (finding,) = run(32.0, 1.0009)
    assert finding.message == (
        "the mini-batch gradients' variance tr(Sigma)/B (1) explains nearly all of their squared norm (1, mean) over "
        "steps 0-4: the mean gradient is not measurably different from zero at B = 32, so each step follows noise")
    (finding,) = run(32.0, 0.5)  # |g|^2 below tr(Sigma)/B: the squared norm is the noise's part alone
    assert "variance tr(Sigma)/B (1) explains all of their squared norm (1, mean)" in finding.message


@pytest.mark.parametrize("norm_test, found", [(0.96, True), (0.9, False)])
def test_without_grad_variance_the_norm_test_gives_the_noise(norm_test, found):
    """NormTest t = sqrt(tr(Sigma) / (B |g|^2)): tr(Sigma) = t^2 B |g|^2, so B_simple / B = t^2 / (1 - t^2): 11.76
    at t = 0.96, 4.26 at t = 0.9 (below 10)."""
    diagnosis = Diagnosis(names=["w"], shapes=[(4, 4)])
    for step in range(6):
        diagnosis.feed(step, {"Loss": 2.3, "GradNorm": [2.0], "NormTest": norm_test, "batch": {"size": 32}})
    found_ = [f.evidence["noise_over_batch"] for f in diagnosis.findings if f.kind == "noise_dominates"]
    assert found_ == ([pytest.approx(0.96 ** 2 / (1 - 0.96 ** 2), rel=1e-3)] if found else [])


@pytest.mark.parametrize("variance, grads", [([math.nan], [1.0]), ([64.0], [math.inf])])
def test_a_record_with_a_non_finite_part_is_left_out(variance, grads):
    """A batch of one sample has no variance (NaN); an overflowed gradient norm: neither record is read, so a
    window of them finds nothing (and never a NaN ratio)."""
    diagnosis = Diagnosis(names=["w"], shapes=[(4, 4)])
    for step in range(6):
        diagnosis.feed(step, {"Loss": 2.3, "GradNorm": grads, "GradVariance": variance, "batch": {"size": 32}})
    assert not [f for f in diagnosis.findings if f.kind == "noise_dominates"]
