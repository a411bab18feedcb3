"""``input_independent_baseline``: a model that ignores its input trains identically on zeros."""

from check_cases import BROKEN, CASES

from cockpit_lite import checks


def _result(case):
    return checks.run(case.model, case.loss_fn, case.batch, **case.options,
                      checks=["input_independent_baseline"])["input_independent_baseline"]


def test_ignoring_the_input_gives_a_ratio_of_one():
    assert _result(BROKEN["ignores_input"]()).value == 1.0


def test_token_and_regression_models_beat_zeroed_inputs():
    for name in ("causal_transformer", "regression_mlp", "lstm_classifier"):
        assert _result(CASES[name]()).value < 0.5
