"""``overfit_one_batch``: reports the steps it took, names the softmax bug, uses a passed optimizer."""

import torch
from check_cases import BROKEN, CASES

from cockpit_lite import checks


def _result(case, **options):
    return checks.run(case.model, case.loss_fn, case.batch, **{**case.options, **options},
                      checks=["overfit_one_batch"])["overfit_one_batch"]


def test_healthy_models_overfit_fast_and_say_how_fast():
    for name in ("digits_mlp", "regression_mlp", "causal_transformer"):
        result = _result(CASES[name]())
        assert result.passed, result.message
        steps = int(result.message.split(" in ")[1].split()[0])
        assert steps < 300 and "steps (Adam, lr " in result.message, result.message


def test_softmax_before_cross_entropy_is_named():
    result = _result(BROKEN["softmax_before_ce"]())
    assert result.passed is False and "remove the softmax" in result.fix


def test_the_passed_optimizer_is_used():
    case = CASES["digits_mlp"]()
    slow = torch.optim.SGD(case.model.parameters(), lr=1e-6)
    result = _result(case, optimizer=slow)
    assert result.passed is False and "SGD" in result.message and "after 300 steps" in result.message


def test_a_failure_says_its_reference_and_the_retry_at_the_lower_rate():
    """Without an optimizer, a model that cannot overfit is tried again at 1e-3; the message names the reference,
    ln C (classification) or the initial loss (regression); 16 samples of the batch are used."""
    result = _result(BROKEN["softmax_before_ce"]())
    assert result.passed is False and result.message.startswith("loss "), result.message
    assert " on 16 samples after 300 steps (Adam, lr 0.001); needs <= 0.05 x ln C = " in result.message
    frozen_head = CASES["regression_mlp"]()
    slow = torch.optim.SGD(frozen_head.model.parameters(), lr=1e-9)
    result = _result(frozen_head, optimizer=slow)
    assert result.passed is False and "(SGD); needs <= 0.05 x the initial loss = " in result.message, result.message


def test_classes_come_from_the_output_without_num_classes():
    case = CASES["digits_mlp"]()
    options = {k: v for k, v in case.options.items() if k != "num_classes"}
    result = checks.run(case.model, case.loss_fn, case.batch, **options,
                        checks=["overfit_one_batch"])["overfit_one_batch"]
    assert result.passed and result.threshold == "<= 0.05", result


def test_a_frozen_model_fails_naming_the_fix():
    case = CASES["digits_mlp"]()
    case.model.requires_grad_(False)
    result = _result(case)
    assert (result.passed, result.value, result.threshold) == (False, None, "")
    assert (result.message, result.fix) == ("no parameter requires grad", "unfreeze the model")


def test_dropout_is_off_while_the_copy_memorises():
    """A dropout of 0.9 after the first layer would keep the loss on 16 samples far from zero; off, it passes."""
    torch.manual_seed(0)
    case = CASES["digits_mlp"]()
    model = torch.nn.Sequential(case.model[0], case.model[1], torch.nn.Dropout(0.9), *case.model[2:])
    result = checks.run(model, case.loss_fn, case.batch, **case.options, checks=["overfit_one_batch"])
    assert result["overfit_one_batch"].passed, result["overfit_one_batch"]


def test_a_classifiers_target_is_five_percent_of_ln_c_whatever_its_initial_loss():
    """A digits MLP scaled to a large initial loss, under an optimizer that cannot move it: its target is
    0.05 x ln 10 = 0.115, not a share of its initial loss."""
    case = CASES["digits_mlp"]()
    with torch.no_grad():
        for p in case.model.parameters():
            p.mul_(30.0)
    slow = torch.optim.SGD(case.model.parameters(), lr=1e-9)
    result = _result(case, optimizer=slow)
    assert result.passed is False and result.message.endswith("needs <= 0.05 x ln C = 0.115"), result.message
