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
