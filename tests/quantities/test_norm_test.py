"""NormTest against a brute-force float64 reference."""

import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import NormTest


def norm_test(individual):
    """sqrt(Σ_n ‖g_n − g‖² / ((B−1) B ‖g‖²)) of flattened individual gradients [B, D]."""
    b = individual.shape[0]
    g = individual.mean(0)
    return torch.sqrt(((individual - g) ** 2).sum() / ((b - 1) * b * (g**2).sum()))


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [gr.reshape(gr.shape[0], -1) for gr in grads]
    return norm_test(torch.cat(flat, 1)), [norm_test(f) for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(NormTest(), reference, case)


def test_logarithmic_schedule():
    quantity = NormTest(track_schedule=schedules.logarithmic(0, 0.7, steps=3))
    problems.check(quantity, reference, ("cnn", 5, "sum"), steps=7, schedule_steps=[0, 1, 2, 5])


def test_a_spread_lost_in_rounding_is_nan_and_flagged():
    """float32 individual gradients of the last bias nearly the same in every sample (targets 10⁵
    away, as in tests/quantities/test_mean_gsnr.py, where GradVariance flags the same bias):
    Σ_n ‖g̃_n‖² − B ‖g‖² cannot resolve their spread in float32 (it came out 0, unflagged); the
    float64 brute force of the same float32 gradients is tiny but not 0 (3.6e-7). The last bias is
    NaN with one flag naming it; the other layers and the total keep their values."""
    problems.assert_lost_spread_flagged(NormTest(), norm_test, offset=1e5)


def test_bf16_autocast_matches_brute_force_of_the_same_forward():
    """Under bf16 autocast the spread Σ_n ‖g̃_n‖² − B ‖g‖² takes ``g`` summed from the individual gradients:
    with autograd's bf16-rounded gradient the last bias's NormTest was 0.00596 against 0.00075."""
    problems.assert_matches_the_same_autocast_forward(NormTest, norm_test)
