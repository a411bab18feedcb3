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
