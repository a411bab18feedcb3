"""``init_loss``: compared with ln C, one-sided, skipped for regression."""

import math

from check_cases import BROKEN, CASES

from cockpit_lite import checks


def _result(case):
    return checks.run(case.model, case.loss_fn, case.batch, **case.options, checks=["init_loss"])["init_loss"]


def test_healthy_ratio_is_near_one_and_large_logits_fail():
    healthy = _result(CASES["digits_mlp"]())
    assert abs(healthy.value - 1) < 0.1 and healthy.passed and healthy.fix == ""
    broken = _result(BROKEN["huge_init"]())
    assert broken.passed is False and broken.value > 3 and "scale the last layer down" in broken.fix
    assert f"{math.log(10):.3g}" in broken.message
    assert broken.threshold == "<= 1.5"  # RATIO, one-sided


def test_regression_is_skipped():
    result = _result(CASES["regression_mlp"]())
    assert result.status == "skipped" and "regression: ln C applies to classification only" in result.message


def test_a_ratio_on_the_threshold_passes(monkeypatch):
    """``RATIO`` set to the ratio a model measures: the bound belongs to the passing side."""
    from cockpit_lite.checks import init_loss

    monkeypatch.setattr(init_loss, "RATIO", _result(CASES["digits_mlp"]()).value)
    assert _result(CASES["digits_mlp"]()).passed
