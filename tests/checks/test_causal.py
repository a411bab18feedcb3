"""Causal checks: skipped (with the reason) where they do not apply, the leak names the fix."""

from check_cases import BROKEN, CASES

from cockpit_lite import checks

NAMES = ["causal_forward", "causal_backward"]


def _run(case, **options):
    return checks.run(case.model, case.loss_fn, case.batch, **{**case.options, **options}, checks=NAMES)


def test_not_a_sequence_model_is_skipped():
    report = _run(CASES["digits_mlp"]())
    assert report.skipped == NAMES and "sequence_dim=None" in report["causal_forward"].message


def test_a_sequence_classifier_is_skipped_not_passed():
    report = _run(CASES["lstm_classifier"](), sequence_dim=2)  # rows of the digit are its sequence
    assert report.skipped == NAMES and "no sequence axis" in report["causal_backward"].message


def test_sequences_of_one_position_are_inconclusive_and_two_decide():
    case = CASES["lstm_lm"]()
    x, y = case.batch
    report = checks.run(case.model, case.loss_fn, (x[:, :1], y[:, :1]), **case.options, checks=NAMES)
    assert report.inconclusive == NAMES
    assert report["causal_forward"].message == (
        "inconclusive: the inputs have no sequence axis 1 of length >= 2: no later position to leak from")
    assert report["causal_forward"].fix == "pass sequences of at least 2 positions"
    report = checks.run(case.model, case.loss_fn, (x[:, :2], y[:, :2]), **case.options, checks=NAMES)  # the fix
    assert report.passed == NAMES


def test_causal_models_pass_and_leaks_fail_with_the_mask_fix():
    report = _run(CASES["causal_transformer"]())
    assert report.passed == NAMES
    assert "changing later positions leaves earlier outputs unchanged" in report["causal_forward"].message
    assert _run(CASES["lstm_lm"]()).passed == NAMES
    report = _run(BROKEN["mask_off_by_one"]())
    assert report.failed == NAMES and "causal attention mask" in report["causal_forward"].fix
    assert "changing later positions moves earlier outputs" in report["causal_forward"].message
