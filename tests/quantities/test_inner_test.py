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


def test_a_spread_lost_in_rounding_is_nan_and_flagged():
    """float32 individual gradients of the last bias nearly the same in every sample (targets 10⁷
    away, as in tests/quantities/test_mean_gsnr.py, where GradVariance flags the same bias): the
    rounding of the projections g̃_nᵀg in float32 exceeds their spread (it came out 7.5e-9,
    unflagged; 10⁵ away they still resolve it, 1.684e-7 against 1.687e-7); the float64 brute force
    of the same float32 gradients is tiny but not 0 (2.3e-9). The last bias is NaN with one flag
    naming it; the other layers and the total keep their values."""
    problems.assert_lost_spread_flagged(InnerTest(), inner_test, offset=1e7)
