"""``noise_dominates``: no "inf x the batch size" or "~1e+06" advice when the noise explains all of
the gradient's norm; the quoted factor where the ratio is meaningful."""

import math

import pytest

from cockpit_lite.diagnosis import Diagnosis


def run(trace, squared, losses=None, batch=32):
    diagnosis = Diagnosis(names=["w"], shapes=[(4, 4)])
    for step in range(6):
        loss = losses[step] if losses else 2.3
        diagnosis.feed(step, {"Loss": loss, "GradNorm": [math.sqrt(squared)], "GradVariance": [trace],
                              "batch": {"size": batch}})
    return [f for f in diagnosis.findings if f.kind == "noise_dominates"]


@pytest.mark.parametrize("trace, squared, explains, simple", [
    # |g|^2 = 2 equals tr(Sigma)/B up to sqrt's rounding: all or nearly all
    (64.0, 1.0, "explains all of", math.inf), (64.0, 2.0, "all of", None),
    # |G|^2 = 2 + 1e-7 - 64 / 32 = 1e-7: B_simple = 64 / 1e-7
    (64.0, 2.0 + 1e-7, "explains nearly all of", 6.4e8)])
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
