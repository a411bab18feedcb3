"""Lanczos on an operator too large for it to span (2000 dimensions, at most 100 products).

The problems of the quantity tests have 23-86 parameters: there Lanczos spans nearly the
whole space and any stopping rule ends at the exact value. Here it must stop on its
residual rule, so the rule itself is tested: a *relative* residual of ``rtol`` (default
1e-3) whatever the operator's scale. An absolute rule ``residual ≤ rtol`` would stop at
once on a small operator and never on a large one.
"""

import pytest
import torch

from cockpit_lite.linalg import lanczos_max_eig

D = 2000
LAMBDA_MAX = 1.0


def low_rank_plus_noise(seed=0):
    """``A = Σ_k λ_k u_k u_kᵀ + diag(noise)``: five planted directions above a bulk in [0, 0.5).

    Returned as a matvec, with its exact top eigenvalue from ``torch.linalg.eigvalsh``.
    """
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(D, 5, generator=g, dtype=torch.float64))
    top = torch.tensor([LAMBDA_MAX, 0.9, 0.85, 0.8, 0.75], dtype=torch.float64)
    noise = torch.rand(D, generator=g, dtype=torch.float64) * 0.5
    matrix = (u * top) @ u.T + torch.diag(noise)
    return matrix, float(torch.linalg.eigvalsh(matrix)[-1])


@pytest.fixture(scope="module")
def operator():
    return low_rank_plus_noise()


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 1e4])
def test_default_tolerance_gives_relative_accuracy_at_any_scale(operator, scale):
    """With the defaults, λ_max to 1e-3 relative, in the same number of products at every scale."""
    matrix, exact = operator
    start = torch.randn(D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    value, vectors, iterations = lanczos_max_eig(lambda v: scale * (matrix @ v), start)
    _, _, unscaled_iterations = lanczos_max_eig(lambda v: matrix @ v, start)
    assert 5 < iterations < 100  # stopped by the residual rule, long before spanning the space
    assert iterations == unscaled_iterations
    assert float(value) <= scale * exact * (1 + 1e-12)  # a Ritz value never exceeds λ_max
    assert abs(float(value) - scale * exact) <= 1e-3 * scale * exact
    residual = (scale * (matrix @ vectors[0]) - value * vectors[0]).norm()
    assert float(residual) <= 1e-3 * abs(float(value)) * (1 + 1e-9)


def test_tighter_tolerance_is_more_accurate(operator):
    matrix, exact = operator
    start = torch.randn(D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    loose, _, few = lanczos_max_eig(lambda v: matrix @ v, start, rtol=1e-2)
    tight, _, many = lanczos_max_eig(lambda v: matrix @ v, start, rtol=1e-8, maxiter=300)
    assert few < many < 300
    assert abs(float(tight) - exact) <= 1e-8 * exact
    assert abs(float(tight) - exact) < abs(float(loose) - exact)
