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


@pytest.mark.parametrize("trace, squared", [(64.0, 1.0), (64.0, 2.0), (64.0, 2.0 + 1e-7)])
def test_no_infinite_or_absurd_numbers_in_the_advice(trace, squared):
    found = run(trace, squared)  # tr(Sigma)/B = 2: the noise is (nearly) all of |g|^2
    assert len(found) == 1
    text = found[0].message + found[0].suggestion
    assert "inf" not in text and "e+0" not in text, text
    assert "not measurably different from zero" in found[0].message


def test_a_meaningful_ratio_is_quoted():
    found = run(64.0, 2.0 + 0.05)  # B_simple / B = 2 / (32 * 0.05) ... = 40
    assert len(found) == 1 and "40x the batch size" in found[0].message
    assert "towards ~1.3e+03" in found[0].suggestion


def test_severity_is_info_while_the_loss_falls():
    falling = [2.3, 2.2, 2.0, 1.5, 1.2, 1.0]
    assert run(64.0, 1.0, falling)[0].severity == "info"
    assert run(64.0, 1.0)[0].severity == "warning"
