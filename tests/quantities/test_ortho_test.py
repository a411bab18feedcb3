"""OrthoTest against a brute-force float64 reference."""

import pytest
import torch

import problems
from cockpit_lite.quantities import OrthoTest


def ortho_test(individual):
    """sqrt(Σ_n ‖g_n − (g_nᵀg/‖g‖²) g‖² / ((B−1) B ‖g‖²)) of individual gradients [B, D]."""
    b = individual.shape[0]
    g = individual.mean(0)
    orthogonal = individual - torch.outer(individual @ g / (g @ g), g)
    return torch.sqrt((orthogonal**2).sum() / ((b - 1) * b * (g @ g)))


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [gr.reshape(gr.shape[0], -1) for gr in grads]
    return ortho_test(torch.cat(flat, 1)), [ortho_test(f) for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(OrthoTest(), reference, case)


def test_a_spread_lost_in_rounding_is_nan_and_flagged():
    """float32 individual gradients of the last bias nearly collinear (targets 10⁵ away, as in
    tests/quantities/test_mean_gsnr.py, where GradVariance flags the same bias):
    Σ_n ‖g̃_n‖² − Σ_n (g̃_nᵀg)² / ‖g‖² cannot resolve their spread in float32 (it came out 5.7e-5,
    unflagged); the float64 brute force of the same float32 gradients is tiny but not 0 (3.2e-7).
    The last bias is NaN with one flag naming it; the other layers and the total keep their values."""
    problems.assert_lost_spread_flagged(OrthoTest(), ortho_test, offset=1e5)


def test_bf16_autocast_matches_brute_force_of_the_same_forward():
    """Under bf16 autocast the spread Σ_n ‖g̃_n‖² − Σ_n (g̃_nᵀg)² / ‖g‖² takes ``‖g‖²`` summed from the individual
    gradients: with autograd's bf16-rounded gradient the last bias's spread came out negative (NaN, flagged)."""
    problems.assert_matches_the_same_autocast_forward(OrthoTest, ortho_test)
