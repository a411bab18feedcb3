"""The Rayleigh-Ritz step of block Lanczos against a dense brute force on its own basis.

The vectors ``lanczos_max_eig`` multiplies are its basis vectors ``q_1, q_2, ...`` in
order, so a recording operator gives the test the basis ``Q_m`` after every product.
From it the test forms ``M = Q A Qᵀ`` (rows of ``Q`` the basis vectors) densely and solves each leading block with
``torch.linalg.eigh``: the Ritz pairs of the first ``m`` products, their residuals
``‖A y − θ y‖`` from fresh products with ``A``, and so the product at which the rule
``‖A y − θ y‖ ≤ rtol |θ|`` first holds. A solver on the wrong band, the wrong block or
the wrong end of the spectrum returns other values, other vectors or stops elsewhere.
"""

import pytest
import torch

from cockpit_lite.linalg import lanczos_max_eig
from test_linalg import recording


def symmetric(d, seed, spectrum):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q @ torch.diag(spectrum) @ q.T


def planted(d, seed):
    """A close top triple (1, 0.99, 0.985) above a bulk in [0, 0.9), and -3 below it (largest in magnitude)."""
    g = torch.Generator().manual_seed(seed)
    top = torch.tensor([1.0, 0.99, 0.985, -3.0], dtype=torch.float64)
    return symmetric(d, seed, torch.cat([top, 0.9 * torch.rand(d - 4, generator=g, dtype=torch.float64)]))


def dense_ritz(a, basis, m):
    """Ritz values (ascending), Ritz vectors (columns) and the top pair's residual on ``basis[:m]``."""
    q = basis[:m].double()
    values, vectors = torch.linalg.eigh(q @ a @ q.T)
    ritz = q.T @ vectors
    residual = float((a @ ritz[:, -1] - values[-1] * ritz[:, -1]).norm())
    return values, ritz, residual


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_ritz_pairs_and_stopping_product_match_a_dense_rayleigh_ritz(rows, dtype):
    rtol = 1e-3
    a = planted(300, rows)
    matvec, seen = recording(a.to(dtype))
    starts = torch.randn(rows, 300, generator=torch.Generator().manual_seed(10 + rows), dtype=dtype)
    value, vectors, products = lanczos_max_eig(matvec, starts, rtol=rtol)
    assert products == len(seen) and rows < products < 100
    basis = torch.stack(seen)
    exact = float(torch.linalg.eigvalsh(a)[-1])

    ratios = []  # residual / (rtol |θ|) after each product, from the dense Rayleigh-Ritz
    for m in range(1, products + 1):
        values, _, residual = dense_ritz(a, basis, m)
        ratios.append(residual / (rtol * abs(float(values[-1]))))
    margin = 1e-8 if dtype == torch.float64 else 2e-3  # clear of the rounding of either side's residual
    assert all(r > 1 + margin for r in ratios[:-1]) and ratios[-1] < 1 - margin, ratios

    values, ritz, residual = dense_ritz(a, basis, products)
    scale = float(torch.linalg.matrix_norm(a, 2))
    precision = 1e-12 if dtype == torch.float64 else 1e-5
    assert abs(float(value) - float(values[-1])) <= precision * scale
    assert float(value) <= exact + precision * scale  # Cauchy interlacing
    eigenvalues = torch.linalg.eigvalsh(a)
    assert float((eigenvalues - float(value)).abs().min()) <= residual * (1 + 1e-6) + precision * scale
    assert vectors.shape == (3, 300) and vectors.dtype == dtype
    overlaps = (vectors.double() @ ritz[:, [-1, -2, -3]]).abs()
    torch.testing.assert_close(overlaps, torch.eye(3, dtype=torch.float64), atol=100 * precision, rtol=0)


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_the_coefficients_outside_the_band_are_rounding(rows):
    """``q_iᵀ A q_j`` for ``|i − j| > rows`` (the entries the band solver leaves out) is at the
    rounding level of ``‖A‖``, also from a start 1e-8 off the top eigenvector (cancellation)."""
    a = planted(200, 20 + rows)
    top = torch.linalg.eigh(a)[1][:, -1]
    g = torch.Generator().manual_seed(30 + rows)
    for starts in (torch.randn(rows, 200, generator=g, dtype=torch.float64),
                   torch.cat([top[None] + 1e-8 * torch.randn(1, 200, generator=g, dtype=torch.float64),
                              torch.randn(rows - 1, 200, generator=g, dtype=torch.float64)])):
        matvec, seen = recording(a)
        lanczos_max_eig(matvec, starts, rtol=0, maxiter=60)
        basis = torch.stack(seen)
        coefficients = basis @ a @ basis.T
        i, j = torch.meshgrid(torch.arange(len(seen)), torch.arange(len(seen)), indexing="ij")
        outside = coefficients[(i - j).abs() > rows]
        assert float(outside.abs().max()) <= 1e-13 * float(torch.linalg.matrix_norm(a, 2))
        assert float(coefficients[(i - j).abs() == rows].abs().max()) > 0.1  # the band itself is not


@pytest.mark.parametrize("rows,dimension", [(1, 4), (2, 7), (3, 9)])
def test_an_invariant_block_krylov_space_is_exhausted_exactly(rows, dimension):
    """Eigenvalues 3, 1.5 (twice), -2 (three times) and 0.5 (34 times): the block Krylov space of
    ``rows`` random starts has dimension Σ min(multiplicity, rows). With rtol = 0 Lanczos
    multiplies all of it (dropping the directions that deflate on the way) and stops with
    residual zero: λ_max exact, the Ritz vectors the eigenvectors of 3 and of 1.5."""
    spectrum = torch.tensor([3.0, 1.5, 1.5, -2.0, -2.0, -2.0] + [0.5] * 34, dtype=torch.float64)
    a = symmetric(40, 40 + rows, spectrum)
    starts = torch.randn(rows, 40, generator=torch.Generator().manual_seed(50 + rows), dtype=torch.float64)
    matvec, seen = recording(a)
    value, vectors, products = lanczos_max_eig(matvec, starts, rtol=0)
    assert products == len(seen) == dimension
    assert abs(float(value) - 3.0) <= 1e-12 * 3.0
    eigenvectors = torch.linalg.eigh(a)[1]
    assert abs(float(vectors[0] @ eigenvectors[:, -1])) >= 1 - 1e-10
    if rows >= 2:  # the next two Ritz vectors span the eigenspace of 1.5
        projection = vectors[1:] @ eigenvectors[:, -3:-1]
        torch.testing.assert_close(projection @ projection.T, torch.eye(2, dtype=torch.float64), atol=1e-10, rtol=0)
    assert float((a @ vectors[0] - value * vectors[0]).norm()) <= 1e-10


@pytest.mark.parametrize("rows", [1, 2, 3])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nonfinite_later_product_gives_nan_at_once(rows, bad):
    a = planted(50, 60 + rows)
    calls = []

    def matvec(v):
        calls.append(None)
        out = a @ v
        if len(calls) == 4:
            out[7] = bad
        return out

    starts = torch.randn(rows, 50, generator=torch.Generator().manual_seed(70 + rows), dtype=torch.float64)
    value, vectors, products = lanczos_max_eig(matvec, starts, rtol=1e-12)
    assert torch.isnan(value) and value.dtype == torch.float64
    assert products == len(calls) == 4 and vectors.shape == (1, 50)


@pytest.mark.parametrize("keep", [1, 5])
def test_keep_returns_that_many_top_ritz_vectors(keep):
    a = planted(120, 80)
    matvec, seen = recording(a)
    starts = torch.randn(2, 120, generator=torch.Generator().manual_seed(81), dtype=torch.float64)
    value, vectors, products = lanczos_max_eig(matvec, starts, rtol=1e-6, keep=keep)
    values, ritz, _ = dense_ritz(a, torch.stack(seen), products)
    assert vectors.shape == (keep, 120)
    assert abs(float(value) - float(values[-1])) <= 1e-12 * 3
    overlaps = (vectors @ ritz[:, -keep:].flip(1)).abs()
    torch.testing.assert_close(overlaps, torch.eye(keep, dtype=torch.float64), atol=1e-8, rtol=0)
