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
