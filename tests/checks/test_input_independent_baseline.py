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


def _shuffled(case):
    """The batch's labels permuted apart from their inputs (the loader's bug); data['test'] stays clean."""
    import torch

    x, y = case.batch
    permuted = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    return checks.run(case.model, case.loss_fn, (x, permuted), **case.options,
                      checks=["input_independent_baseline"])["input_independent_baseline"]


def test_labels_shuffled_apart_from_their_inputs_fail_on_held_out_samples():
    for name in ("digits_mlp", "regression_mlp"):
        result = _shuffled(CASES[name]())
        assert result.passed is False and "held-out" in result.message and "shuffled" in result.fix, result


def test_healthy_models_beat_zeroed_inputs_on_held_out_samples():
    for name in ("digits_mlp", "bn_cnn", "lstm_classifier", "regression_mlp"):
        result = _result(CASES[name]())
        assert result.passed and "held-out" in result.message, result


def test_without_data_the_batch_is_split():
    case = CASES["digits_mlp"]()
    options = {k: v for k, v in case.options.items() if k != "data"}
    result = checks.run(case.model, case.loss_fn, case.batch, **options,
                        checks=["input_independent_baseline"])["input_independent_baseline"]
    assert result.passed and "second half of the batch" in result.message, result
