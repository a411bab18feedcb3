"""``gradient_check``: names the parameter upstream of a wrong backward; kinks and BatchNorm pass."""

from check_cases import BROKEN, CASES

from cockpit_lite import checks


def _result(case):
    return checks.run(case.model, case.loss_fn, case.batch, **case.options,
                      checks=["gradient_check"])["gradient_check"]


def test_wrong_custom_backward_names_the_parameter():
    result = _result(BROKEN["wrong_backward"]())
    assert result.passed is False and result.message.startswith("`1.")  # the layer before the custom ReLU


def test_relu_maxpool_batchnorm_and_attention_agree():
    for name in ("bn_cnn", "causal_transformer", "lstm_classifier"):
        result = _result(CASES[name]())
        assert result.passed and result.value < 1e-5, result.message
