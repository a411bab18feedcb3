"""Lanczos λ_max against torch.linalg.eigvalsh."""

import pytest
import torch

from cockpit_lite.linalg import lanczos_max_eig, power_max_eig


def symmetric(d, seed, spectrum):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q @ torch.diag(spectrum) @ q.T


@pytest.mark.parametrize("seed", range(3))
def test_top_eigenvalue_with_negative_and_clustered_spectrum(seed):
    """Largest algebraic eigenvalue, even when a negative one is larger in magnitude."""
    g = torch.Generator().manual_seed(100 + seed)
    spectrum = torch.cat([torch.tensor([-9.0, 4.0, 3.96]), torch.rand(197, generator=g, dtype=torch.float64) * 3])
    a = symmetric(200, seed, spectrum.double())
    start = torch.randn(200, generator=g, dtype=torch.float64)
    value, vectors, _ = lanczos_max_eig(lambda v: a @ v, start, rtol=1e-6, maxiter=200)
    torch.testing.assert_close(value, torch.linalg.eigvalsh(a).max(), rtol=1e-6, atol=0)
    assert torch.allclose(a @ vectors[0], value * vectors[0], atol=1e-3)


def test_warm_start_from_previous_ritz_vectors_needs_fewer_products():
    g = torch.Generator().manual_seed(0)
    spectrum = torch.cat([torch.tensor([5.0, 4.8, 4.7]), torch.rand(997, generator=g) * 4.5]).double()
    a = symmetric(1000, 1, spectrum)
    perturbation = symmetric(1000, 2, torch.randn(1000, generator=g).double() * 1e-3)
    start = torch.randn(1000, generator=g, dtype=torch.float64)
    _, vectors, cold = lanczos_max_eig(lambda v: a @ v, start, rtol=1e-5, maxiter=300)
    b = a + perturbation
    warm_start = vectors.sum(0) + 0.3 * start / start.norm()
    value, _, warm = lanczos_max_eig(lambda v: b @ v, warm_start, rtol=1e-5, maxiter=300)
    _, _, cold_b = lanczos_max_eig(lambda v: b @ v, start, rtol=1e-5, maxiter=300)
    torch.testing.assert_close(value, torch.linalg.eigvalsh(b).max(), rtol=1e-4, atol=0)
    assert warm < cold_b and warm < cold


def test_nonfinite_product_gives_nan():
    value, _, iterations = lanczos_max_eig(lambda v: v * float("nan"), torch.ones(4))
    assert torch.isnan(value) and iterations == 1


def test_zero_operator():
    value, _, _ = lanczos_max_eig(lambda v: 0 * v, torch.ones(4, dtype=torch.float64))
    assert value == 0


def test_power_iteration_finds_the_largest_magnitude_eigenvalue():
    """Cockpit's power iteration: the dominant (largest |λ|) eigenvalue, here negative."""
    g = torch.Generator().manual_seed(3)
    spectrum = torch.cat([torch.tensor([-6.0, 3.0]), torch.rand(48, generator=g, dtype=torch.float64)])
    a = symmetric(50, 4, spectrum.double())
    value, vector, iterations = power_max_eig(lambda v: a @ v, torch.rand(50, generator=g, dtype=torch.float64), rtol=1e-10)
    torch.testing.assert_close(value, torch.tensor(-6.0, dtype=torch.float64), rtol=1e-6, atol=0)
    assert iterations < 100 and torch.allclose(a @ vector, value * vector, atol=1e-2)


def test_power_iteration_stops_on_a_zero_operator():
    value, _, iterations = power_max_eig(lambda v: 0 * v, torch.ones(4, dtype=torch.float64))
    assert value == 0 and iterations == 1
