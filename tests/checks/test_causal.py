"""Causal checks: skipped (with the reason) where they do not apply, the leak names the fix."""

import torch
from check_cases import BROKEN, CASES

from cockpit_lite import checks
from cockpit_lite.checks import dependence
from cockpit_lite.checks.causal import FIX

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


class _CausalConvBN(torch.nn.Module):
    """A causal convolution (padded on the left only) over ``[B, T, C]``, then BatchNorm1d: in train mode its
    batch statistics run over every position, so later positions move earlier outputs through them."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = torch.nn.Conv1d(3, 4, 2), torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(self.conv(torch.nn.functional.pad(x.transpose(1, 2), (1, 0)))).transpose(1, 2)


def test_batch_norm_is_judged_with_its_running_statistics():
    torch.manual_seed(0)
    batch = (torch.randn(6, 8, 3), torch.randn(6, 8, 4))
    report = checks.run(_CausalConvBN(), torch.nn.functional.mse_loss, batch, task="regression", sequence_dim=1,
                        checks=NAMES)
    assert report.passed == NAMES, [str(r) for r in report]
    assert report["causal_forward"].message.endswith(
        "(BatchNorm1d (1) in eval mode: they mix samples by design in train mode)")


def test_inputs_without_the_sequence_axis_are_inconclusive():
    batch = (torch.randn(6), torch.randn(6))
    report = checks.run(torch.nn.Identity(), torch.nn.functional.mse_loss, batch, task="regression", sequence_dim=1,
                        checks=NAMES)
    assert report.inconclusive == NAMES, [str(r) for r in report]


def test_a_forward_leak_on_the_bound_passes_in_the_clean_sentence(monkeypatch):
    monkeypatch.setattr(dependence, "forward_leak", lambda *args: dependence.LEAK)
    result = _run(CASES["lstm_lm"]())["causal_forward"]
    assert result.passed and result.message == "no dependence: changing later positions leaves earlier outputs unchanged"


class _SeesTheLast(torch.nn.Module):
    """Every output position reads the last input position 1000 times as strongly as its own."""

    def forward(self, x):
        return x + 1000 * x[:, -1:]


def test_the_backward_leak_is_relative_to_the_earlier_positions_gradient_and_names_the_fix():
    """The leak is measured against the gradient at the allowed (earlier) positions only: about 1000 here,
    not capped at 1 by the leak itself."""
    torch.manual_seed(0)
    batch = (torch.randn(4, 6, 3), torch.randn(4, 6, 3))
    result = checks.run(_SeesTheLast(), torch.nn.functional.mse_loss, batch, task="regression", sequence_dim=1,
                        checks=["causal_backward"])["causal_backward"]
    assert result.passed is False and result.value > 10, result
    assert result.message.startswith("relative leak ") and result.message.endswith(
        ": earlier outputs have a gradient w.r.t. later positions of the inputs")
    assert result.fix == FIX
