"""GradVariance against a brute-force float64 reference."""

import pytest

import problems
from cockpit_lite.quantities import GradVariance


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    return [gr.reshape(gr.shape[0], -1).var(0, unbiased=True).sum() for gr in grads]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(GradVariance(), reference, case, layers=False)
