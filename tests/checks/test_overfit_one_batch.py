"""``overfit_one_batch``: reports the steps it took, names the softmax bug, uses a passed optimizer."""

import math
import re

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


def _initial_loss(case):
    """The loss of the user's model on the 16 samples the check trains on (as the copy starts)."""
    with torch.no_grad():
        return float(case.loss_fn(case.model(case.batch[0][:16]), case.batch[1][:16]))


def test_a_pass_reports_the_first_and_last_loss_and_their_ratio_to_ln_c():
    """Adam at 1e-2 overfits the digits MLP (no retry at 1e-3): the message's first loss is the model's own,
    its last ``value · ln 10`` (the ratio reported), at most 5% of ln C."""
    case = CASES["digits_mlp"]()
    first = _initial_loss(case)
    result = _result(case)
    last = result.value * math.log(10)
    assert result.passed and 0 < result.value <= 0.05 and result.threshold == "<= 0.05"
    assert result.message.startswith(f"loss {first:.3g} -> {last:.3g} on 16 samples in "), result.message
    assert result.message.endswith(" steps (Adam, lr 0.01)"), result.message


def test_a_failure_reports_the_first_and_last_loss_and_the_fix():
    """The softmax bug trains 300 steps at 1e-2, then at 1e-3, and fails: the first loss is the model's own, the
    last ``value · ln 10``; the regression twin with a rate that cannot move it names the generic fix."""
    case = BROKEN["softmax_before_ce"]()
    first = _initial_loss(case)
    result = _result(case)
    last = result.value * math.log(10)
    assert result.passed is False and result.value > 0.05 and result.threshold == "<= 0.05"
    assert result.message.startswith(f"loss {first:.3g} -> {last:.3g} on 16 samples after 300 steps"), result.message
    regression = CASES["regression_mlp"]()
    first = _initial_loss(regression)
    result = _result(regression, optimizer=torch.optim.SGD(regression.model.parameters(), lr=1e-9))
    assert result.passed is False and result.message.startswith(f"loss {first:.3g} -> {first:.3g} on 16 samples")
    assert abs(result.value - 1.0) < 1e-6  # (the initial loss is the reference; nothing moved)
    assert result.fix == ("look for a detached or frozen layer (see nonzero_gradients), targets in the wrong format, "
                          "a bottleneck, or an optimizer that cannot move the model")


def test_a_regressions_reference_is_its_loss_before_any_update():
    """A regression with an initial loss below 1 (targets scaled down) under a rate that cannot move it fails
    at a ratio of 1 to its own initial loss; a model that fits its targets exactly (loss 0) passes at once."""
    case = CASES["regression_mlp"]()
    x, y = case.batch
    small = (x, 0.1 * y)
    with torch.no_grad():
        assert float(case.loss_fn(case.model(x[:16]), small[1][:16])) < 1
    result = checks.run(case.model, case.loss_fn, small, **case.options, checks=["overfit_one_batch"],
                        optimizer=torch.optim.SGD(case.model.parameters(), lr=1e-9))["overfit_one_batch"]
    assert result.passed is False and abs(result.value - 1.0) < 1e-6, result
    with torch.no_grad():
        exact = (x, case.model(x))
    result = checks.run(case.model, case.loss_fn, exact, **case.options, checks=["overfit_one_batch"])["overfit_one_batch"]
    assert result.passed and result.value == 0.0 and result.message.startswith("loss 0 -> 0 on 16 samples in 0 steps")
    first = _initial_loss(case)  # (Adam at 1e-2 moves it at the first update)
    result = _result(case)
    assert result.passed and result.message.startswith(f"loss {first:.3g} -> "), result.message


def test_a_diverging_loss_names_the_learning_rate():
    """Updates at 1e12 make the loss non-finite at the third loss: the training stops there (after 2 steps, from the
    model's own loss)."""
    case = CASES["digits_mlp"]()
    first = _initial_loss(case)
    result = _result(case, optimizer=torch.optim.SGD(case.model.parameters(), lr=1e12))
    assert result.passed is False and not math.isfinite(result.value), result
    assert re.match(rf"loss {first:.3g} -> (inf|nan) on 16 samples after 2 steps \(SGD\); ", result.message), result.message
    assert result.fix == "the loss diverged: check the loss and the init scale, or lower the learning rate"


def test_a_passed_optimizer_is_built_once_without_a_retry():
    """The retry at 1e-3 is Adam's; a passed optimizer (here a callable) is used for one training only."""
    case = CASES["regression_mlp"]()
    built = []

    def slow(params):
        built.append(1)
        return torch.optim.SGD(params, lr=1e-9)

    assert _result(case, optimizer=slow).passed is False
    assert len(built) == 1
