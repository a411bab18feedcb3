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


def test_causal_models_pass_and_leaks_fail_with_the_mask_fix():
    report = _run(CASES["causal_transformer"]())
    assert report.passed == NAMES
    assert "changing later positions leaves earlier outputs unchanged" in report["causal_forward"].message
    assert _run(CASES["lstm_lm"]()).passed == NAMES
    report = _run(BROKEN["mask_off_by_one"]())
    assert report.failed == NAMES and "causal attention mask" in report["causal_forward"].fix
    assert "changing later positions moves earlier outputs" in report["causal_forward"].message
