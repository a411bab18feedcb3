"""GradNorm against the brute-force mini-batch gradient."""

import pytest

import problems
from cockpit_lite.quantities import GradNorm


def reference(problem, snapshots, step):
    return [g.norm() for g in problems.gradient(problem, snapshots[step])]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(GradNorm(), reference, case, layers=False)
