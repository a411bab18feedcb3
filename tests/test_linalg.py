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


@pytest.mark.parametrize("expected", [1, 7, 300])
def test_the_basis_grows_past_the_products_it_was_allocated_for(expected):
    """Allocated for 1 product (grown four times), 7, or all: the same products, λ_max and Ritz vectors."""
    g = torch.Generator().manual_seed(3)
    a = symmetric(200, 3, torch.cat([torch.tensor([4.0, 3.9]), torch.rand(198, generator=g) * 3]).double())
    starts = torch.randn(2, 200, generator=g, dtype=torch.float64)
    value, vectors, products = lanczos_max_eig(lambda v: a @ v, starts, rtol=1e-8, maxiter=200, expected=expected)
    torch.testing.assert_close(value, torch.linalg.eigvalsh(a).max(), rtol=1e-8, atol=0)
    reference = lanczos_max_eig(lambda v: a @ v, starts, rtol=1e-8, maxiter=200, expected=200)
    assert products == reference[2] > 30 and torch.equal(vectors, reference[1])


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


def recording(a):
    """``v ↦ a v`` that keeps the vectors it was applied to."""
    seen = []

    def matvec(v):
        seen.append(v.clone())
        return a @ v

    return matvec, seen


@pytest.mark.parametrize("scale", [1e-2, 1e2])
def test_power_iteration_stops_at_the_first_quotients_that_agree_by_the_default_rule(scale):
    """Defaults: stop at the first k ≥ 2 with |q_k − q_{k−1}| ≤ 1e-6 + 1e-3 |q_k|, q_k = v_kᵀ A v_k.

    The quotients are recomputed here from the vectors the operator was applied to.
    """
    g = torch.Generator().manual_seed(5)
    spectrum = scale * torch.cat([torch.tensor([1.0, 0.7], dtype=torch.float64), 0.5 * torch.rand(38, generator=g, dtype=torch.float64)])
    a = symmetric(40, 6, spectrum)
    matvec, seen = recording(a)
    value, vector, iterations = power_max_eig(matvec, torch.rand(40, generator=g, dtype=torch.float64))
    quotients = [float(v @ a @ v) for v in seen]
    assert all(abs(float(v.norm()) - 1) < 1e-12 for v in seen)
    first = next(k for k in range(1, len(quotients)) if abs(quotients[k] - quotients[k - 1]) <= 1e-6 + 1e-3 * abs(quotients[k]))
    assert iterations == len(seen) == first + 1 > 2
    assert float(value) == pytest.approx(quotients[-1], rel=1e-12)
    assert float(vector.norm()) == pytest.approx(1.0)
    assert abs(float(value) - scale) <= 5e-3 * scale


def test_power_iteration_stops_when_two_quotients_are_equal_even_with_zero_tolerances():
    a = torch.diag(torch.tensor([3.0, 1.0, 0.5], dtype=torch.float64))
    value, _, iterations = power_max_eig(lambda v: a @ v, torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64), rtol=0, atol=0)
    assert iterations == 2 and value == 3.0


def test_power_iteration_quotient_of_an_unnormalised_start():
    """One product: the Rayleigh quotient v0ᵀ A v0 / ‖v0‖²."""
    a = symmetric(6, 7, torch.arange(1.0, 7.0, dtype=torch.float64))
    v0 = 3 * torch.randn(6, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    value, vector, iterations = power_max_eig(lambda v: a @ v, v0, maxiter=1)
    torch.testing.assert_close(value, v0 @ a @ v0 / (v0 @ v0))
    torch.testing.assert_close(vector, a @ v0 / (a @ v0).norm())
    assert iterations == 1


@pytest.mark.parametrize("solver", [power_max_eig, lanczos_max_eig])
def test_default_maxiter_is_100_products(solver):
    """Tolerance 0 on an operator Lanczos cannot exhaust in 100 products: 100 products, then the last estimate."""
    g = torch.Generator().manual_seed(9)
    a = symmetric(300, 10, torch.linspace(0.5, 1.0, 300, dtype=torch.float64))
    matvec, seen = recording(a)
    kwargs = dict(rtol=0, atol=0) if solver is power_max_eig else dict(rtol=0)
    value, _, iterations = solver(matvec, torch.randn(300, generator=g, dtype=torch.float64), **kwargs)
    assert iterations == len(seen) == 100
    assert 0.5 <= float(value) <= 1.0 + 1e-12


def test_nonfinite_product_gives_nan_for_power_iteration():
    v0 = torch.full((4,), 2.0, dtype=torch.float64)
    value, vector, iterations = power_max_eig(lambda v: v * float("inf"), v0)
    assert torch.isnan(value) and value.dtype == torch.float64 and iterations == 1
    torch.testing.assert_close(vector, torch.full((4,), 0.5, dtype=torch.float64))


def test_lanczos_returns_the_top_three_ritz_vectors_by_default():
    """A space Lanczos exhausts: the Ritz vectors are the eigenvectors of the three largest eigenvalues."""
    spectrum = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.5, -1.0, -6.0], dtype=torch.float64)
    a = symmetric(8, 11, spectrum)
    start = torch.randn(8, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    value, vectors, _ = lanczos_max_eig(lambda v: a @ v, start, rtol=1e-12)
    _, eigenvectors = torch.linalg.eigh(a)
    assert vectors.shape == (3, 8)
    torch.testing.assert_close(value, torch.tensor(5.0, dtype=torch.float64))
    overlaps = (vectors @ eigenvectors[:, [-1, -2, -3]]).abs()
    torch.testing.assert_close(overlaps, torch.eye(3, dtype=torch.float64), atol=1e-6, rtol=0)


def test_lanczos_one_product_is_the_rayleigh_quotient_of_the_start():
    a = symmetric(6, 13, torch.arange(1.0, 7.0, dtype=torch.float64))
    v0 = 3 * torch.randn(6, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    value, vectors, iterations = lanczos_max_eig(lambda v: a @ v, v0, maxiter=1)
    torch.testing.assert_close(value, v0 @ a @ v0 / (v0 @ v0))
    torch.testing.assert_close(vectors, (v0 / v0.norm())[None])
    assert iterations == 1


def test_lanczos_nonfinite_product_keeps_the_dtype_and_returns_the_start():
    v0 = torch.full((4,), 2.0, dtype=torch.float64)
    value, vectors, iterations = lanczos_max_eig(lambda v: v * float("inf"), v0)
    assert torch.isnan(value) and value.dtype == torch.float64 and iterations == 1
    torch.testing.assert_close(vectors, torch.full((1, 4), 0.5, dtype=torch.float64))


def test_ritz_vectors_stay_orthonormal_when_the_start_is_nearly_an_eigenvector():
    """A start 1e-8 off the top eigenvector: the new direction of each product is a cancellation
    of two vectors 1e8 times longer. Re-orthogonalised twice, the basis (and with it the Ritz
    vectors) is orthonormal to rounding; one Gram-Schmidt pass leaves errors of ~1e-9."""
    g = torch.Generator().manual_seed(0)
    spectrum = 1e6 * torch.cat([torch.tensor([1.0], dtype=torch.float64), 1e-6 * torch.rand(39, generator=g, dtype=torch.float64)])
    a = symmetric(40, 0, spectrum)
    top = torch.linalg.eigh(a)[1][:, -1]
    v0 = top + 1e-8 * torch.randn(40, generator=g, dtype=torch.float64)
    value, vectors, _ = lanczos_max_eig(lambda v: a @ v, v0, rtol=1e-14, maxiter=40)
    assert abs(float(value) - 1e6) <= 1e-9 * 1e6
    gram = vectors @ vectors.T
    assert vectors.shape[0] >= 2
    assert float((gram - torch.eye(vectors.shape[0], dtype=torch.float64)).abs().max()) <= 1e-12


def test_lanczos_answers_in_the_dtype_of_the_start():
    """T's eigenproblem is solved in float64; the estimate comes back as float32 for a float32 operator."""
    a = symmetric(30, 15, torch.linspace(-1.0, 2.0, 30, dtype=torch.float64)).float()
    value, vectors, _ = lanczos_max_eig(lambda v: a @ v, torch.ones(30), rtol=1e-5)
    assert value.dtype == vectors.dtype == torch.float32
    assert abs(float(value) - 2.0) <= 1e-4


def test_a_block_of_two_starts_finds_the_top_of_a_close_pair():
    """λ₁ = 1, λ₂ = 0.99 above a bulk in [0, 0.9): over 60 random starts one start vector
    returns λ₂ (1% low, its residual converged) for some (4), a block of two never does.
    A diagonal operator: Lanczos with Gaussian starts is invariant under a rotation."""
    g = torch.Generator().manual_seed(0)
    spectrum = torch.cat([torch.tensor([1.0, 0.99], dtype=torch.float64), 0.9 * torch.rand(298, generator=g, dtype=torch.float64)])
    exact = float(torch.linalg.eigvalsh(torch.diag(spectrum)).max())
    misses = {1: 0, 2: 0}
    for seed in range(60):
        starts = torch.randn(2, 300, generator=torch.Generator().manual_seed(1000 + seed), dtype=torch.float64)
        for rows in misses:
            value, vectors, _ = lanczos_max_eig(lambda v: spectrum * v, starts[:rows])
            assert float(value) <= exact * (1 + 1e-12)
            misses[rows] += abs(float(value) - exact) > 1e-3 * exact
            if rows == 2:
                assert float((spectrum * vectors[0] - value * vectors[0]).norm()) <= 1e-3 * float(value) * (1 + 1e-9)
    assert misses[1] > 0 and misses[2] == 0, misses


def test_a_start_in_the_span_of_the_others_is_dropped():
    """Rows 0 and 2 span the same line: the block is two starts, and the answer that of rows 0 and 1."""
    a = symmetric(30, 16, torch.linspace(-1.0, 2.0, 30, dtype=torch.float64))
    g = torch.Generator().manual_seed(17)
    first, second = torch.randn(2, 30, generator=g, dtype=torch.float64)
    value, _, products = lanczos_max_eig(lambda v: a @ v, torch.stack([first, second, -3 * first]), rtol=1e-10)
    same, _, same_products = lanczos_max_eig(lambda v: a @ v, torch.stack([first, second]), rtol=1e-10)
    assert products == same_products and float(value) == pytest.approx(float(same), rel=1e-12)
    assert float(value) == pytest.approx(2.0, rel=1e-10)
