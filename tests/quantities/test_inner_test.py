"""InnerTest against a brute-force float64 reference."""

import pytest
import torch

import problems
from cockpit_lite.quantities import InnerTest


def inner_test(individual):
    """sqrt(Var̂_n(g_nᵀg) / (B ‖g‖⁴)) of flattened individual gradients [B, D]."""
    b = individual.shape[0]
    g = individual.mean(0)
    projections = individual @ g
    return torch.sqrt(projections.var(unbiased=True) / (b * (g @ g) ** 2))


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [gr.reshape(gr.shape[0], -1) for gr in grads]
    return inner_test(torch.cat(flat, 1)), [inner_test(f) for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(InnerTest(), reference, case)
