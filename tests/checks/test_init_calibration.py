"""``init_calibration``: near-uniform initial predictions pass, a confident start fails."""

import torch
from check_cases import CASES

from cockpit_lite import checks


def _result(case):
    return checks.run(case.model, case.loss_fn, case.batch, **case.options,
                      checks=["init_calibration"])["init_calibration"]


def test_uniform_start_passes_and_a_biased_last_layer_fails():
    case = CASES["digits_mlp"]()
    assert _result(case).value > 0.95
    with torch.no_grad():
        case.model[-1].bias[3] = 8.0  # the model is sure every digit is a 3
    result = _result(case)
    assert result.passed is False and result.value < 0.2 and "mean top probability 0.99" in result.message
    assert "(uniform: 0.100)" in result.message  # 1 / 10 classes
    assert "initialise the last layer near zero" in result.fix


def test_language_model_reads_the_last_axis():
    assert _result(CASES["causal_transformer"]()).passed


def test_the_value_is_the_mean_entropy_over_ln_c():
    """The last layer's weight zero and its bias the log of p = (0.5, 0.1, ..., 0.1) / 1.4 over 10 classes: every
    sample predicts p (up to the float32 rounding of log p), and the value is H(p) / ln 10 by hand (0.896: a
    pass)."""
    import math

    import pytest

    case = CASES["digits_mlp"]()
    p = [0.5 / 1.4] + [0.1 / 1.4] * 9
    with torch.no_grad():
        case.model[-1].weight.zero_()
        case.model[-1].bias.copy_(torch.tensor(p).log())
    result = _result(case)
    expected = -sum(q * math.log(q) for q in p) / math.log(10)
    assert result.value == pytest.approx(expected, rel=1e-6) and result.passed
    assert f"mean top probability {max(p):.3f}" in result.message


def test_a_regression_model_is_skipped_with_the_reason():
    result = _result(CASES["regression_mlp"]())
    assert result.passed is None and result.value is None, result
    assert "regression: there are no class predictions" in result.message, result
