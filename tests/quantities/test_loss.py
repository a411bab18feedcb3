"""Loss against a recomputation of the mini-batch loss, on every first-order problem."""

import pytest

import problems
from cockpit_lite.quantities import Loss


def reference(problem, snapshots, step):
    return problems.loss(problem, snapshots[step])


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_recomputed_loss(case):
    problems.check(Loss(), reference, case, layers=False)
