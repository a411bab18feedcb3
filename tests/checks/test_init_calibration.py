"""``init_calibration``: near-uniform initial predictions pass, a confident start fails."""

import math

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
    import pytest

    case = CASES["digits_mlp"]()
    p = [0.5 / 1.4] + [0.1 / 1.4] * 9
    with torch.no_grad():
        case.model[-1].weight.zero_()
        case.model[-1].bias.copy_(torch.tensor(p).log())
    result = _result(case)
    expected = -sum(q * math.log(q) for q in p) / math.log(10)
    assert result.value == pytest.approx(expected, rel=1e-6) and result.passed
    assert result.threshold == ">= 0.75" and result.fix == ""
    assert f"mean top probability {max(p):.3f}" in result.message


def test_a_regression_model_is_skipped_with_the_reason():
    result = _result(CASES["regression_mlp"]())
    assert result.passed is None and result.value is None, result
    assert "regression: there are no class predictions" in result.message, result


def _two_samples():
    """A linear model of 3 classes whose two samples predict (0.8, 0.1, 0.1) and (1/3, 1/3, 1/3)."""
    model = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[math.log(0.8), 0.0], [math.log(0.1), 0.0], [math.log(0.1), 0.0]]))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    return model, (x, torch.tensor([0, 1]))


def test_the_mean_top_probability_is_each_sample_s_top_averaged():
    """Top probabilities 0.8 and 1/3: their mean, 0.567 (the largest of all, 0.8, would be no mean)."""
    model, batch = _two_samples()
    result = checks.run(model, torch.nn.functional.cross_entropy, batch, task="classification", num_classes=3,
                        checks=["init_calibration"])["init_calibration"]
    assert "mean top probability 0.567 (uniform: 0.333)" in result.message, result.message


def test_a_value_on_the_threshold_passes(monkeypatch):
    from cockpit_lite.checks import init_calibration

    model, batch = _two_samples()
    run = lambda: checks.run(model, torch.nn.functional.cross_entropy, batch, task="classification",  # noqa: E731
                             num_classes=3, checks=["init_calibration"])["init_calibration"]
    monkeypatch.setattr(init_calibration, "ENTROPY", run().value)
    assert run().passed
