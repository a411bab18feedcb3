"""Largest eigenvalue of a symmetric operator from matrix-vector products (block Lanczos).

``lanczos_max_eig(matvec, starts)`` builds an orthonormal basis ``Q`` of the block Krylov
space ``span{S, AS, A²S, ...}`` of the start vectors ``S`` (rows of ``starts``; one row
is plain Lanczos), one product at a time, with full re-orthogonalisation: each product is
first orthogonalised against the few basis vectors its band of coefficients (below) lies on,
where almost all of its length is, then once against the whole basis, and a second time only
when that pass cancelled more than a third of what was left (Daniel et al., 1976); without the
first, cheap pass the second full pass ran at half the products on the Hessian of a 51k-parameter
MLP (122 of 247), with it at none (each full pass reads the whole basis: there, at 35 vectors,
about two thirds of a Hessian-vector product's time). The
coefficients of that orthogonalisation are ``H = Qᵀ A Q``. With ``b`` independent starts
each product adds at most one basis vector, so ``A q_j`` lies in ``span{q_1, ..., q_{j+b}}``
and ``H`` is banded: ``H_ij = 0`` for ``|i − j| > b``. The coefficients stored below the
band are zero by construction; those above it (re-orthogonalisation against older basis
vectors) are rounding, of the order of the asymmetry ``H_ij − H_ji`` inside the band
(from the operator's and the basis's rounding), and are left out, as the asymmetry is by
symmetrising ``(H + Hᵀ)/2``. After ``m`` products the Ritz values are the eigenvalues of
the leading ``m × m`` block ``H_m`` (Rayleigh-Ritz on the first ``m`` basis vectors), of
which only the top few pairs are computed, by a band eigensolver (LAPACK's ``dsbevx``:
reduction to tridiagonal form, bisection, inverse iteration) rather than a dense
eigendecomposition: about 0.1 ms for ``m = 50``, and no faster with its BLAS held to
one thread (a dense ``numpy.linalg.eigh`` of that size runs threaded, and milliseconds
when another process holds a core). The Ritz vector ``y = Q_m s`` of the largest
one, θ, has the residual ``‖A y − θ y‖ = ‖H[m:, :m] s‖`` (the coefficients of ``A Q_m``
along the basis vectors not yet multiplied). It stops as soon as
``‖A y − θ y‖ ≤ rtol · |θ|``. For a symmetric A some eigenvalue lies within that bound
of θ, and θ never exceeds ``λ_max`` (Cauchy interlacing).

Which eigenvalue that is depends on the start: from one start vector whose component
along the top eigenvector happens to be small, Lanczos converges to the *second*
eigenvalue first when the two are close, with a residual as small as the first's
would be (measured: 3% of random starts on spectra with a 1% gap, 1% low). A block of
independent random starts resolves a cluster of close eigenvalues together (after
``m`` products the space of ``b`` starts contains each start's own Krylov space of
dimension ``⌊m/b⌋``, so θ is at least every Ritz value one of them alone gives there). Measured over random starts: on five diagonal spectra with
the top two to four eigenvalues 1% apart, one start missed 24 of 1,000, two none, for
about 1.5× the products; with three eigenvalues 1.4% apart (1, 0.986, 0.971) one start
missed 6 of 200, two 2, three none; on a small MLP-Mixer's Hessian (top eigenvalues
0.7% and 10% apart) one start missed 21 of 400, two 2, three none (1.3× and 1.5× the
products). Each start more makes a miss rarer, never impossible.
A start in the span of the previous step's top Ritz vectors makes it faster still;
using several of them (not just the top one) keeps it from settling on the old top
eigenvector when two eigenvalues swap places between steps.
"""

import math

import numpy as np
import torch
from scipy.linalg.lapack import dsbevx


def lanczos_max_eig(matvec, v0, rtol=1e-3, maxiter=100, keep=3, expected=16):
    """Return ``(λ_max, Ritz vectors, products)`` of the symmetric operator ``matvec``.

    Args:
        matvec: function mapping a vector (1-d tensor) to ``A @ vector``.
        v0: start vector (1-d, plain Lanczos) or a block of start vectors (rows of a
            2-d tensor; two independent random rows guard against a close second
            eigenvalue, see the module docstring); not necessarily normalised. A row in
            the span of the earlier rows is dropped.
        rtol: relative residual tolerance for convergence.
        maxiter: maximal number of products; the last estimate is returned if it is
            reached (the residual then exceeds ``rtol``).
        keep: number of top Ritz vectors to return.
        expected: products the basis is first allocated for (it doubles when they are
            exceeded: each time a copy of the basis into fresh memory).

    Returns:
        The largest eigenvalue estimate (0-d tensor), the top ``keep`` Ritz vectors
        (rows of a matrix, normalised, the first belongs to the estimate) and the
        number of products used. A non-finite product returns NaN at once.
    """
    starts = v0[None] if v0.dim() == 1 else v0
    basis = starts.new_empty((min(maxiter, max(1, expected)) + starts.shape[0], starts.shape[1]))  # rows q_1, q_2, ...
    size = 0
    for row in starts:
        w = row.clone()
        for _ in range(2):
            w -= basis[:size].T @ (basis[:size] @ w)
        if size == 0 or float(w.norm()) > 1e-8 * float(row.norm()):
            basis[size] = w / w.norm()
            size += 1
    width = size  # H's bandwidth: A q_j lies in the span of q_1 ... q_{j+width}
    h = np.zeros((maxiter + size, maxiter))  # h[i, j] = q_iᵀ A q_j, on the host (tiny)
    band = np.zeros((width + 1, maxiter))  # band[d, j] = (h[j + d, j] + h[j, j + d]) / 2, LAPACK's lower band
    pairs = max(1, keep)  # top Ritz pairs solved for after each product
    for k in range(1, maxiter + 1):
        if k > size:  # every basis vector multiplied, none new: the space is invariant, θ exact
            k -= 1
            break
        w = matvec(basis[k - 1])
        norm = float(w.norm())
        if not math.isfinite(norm):
            if not bool(torch.isfinite(w).all()):
                return torch.tensor(float("nan"), dtype=v0.dtype), basis[:1].clone(), k
            norm = float(w.double().norm())  # finite, but the norm overflowed the dtype
        done = basis[:size]
        near = max(0, k - 1 - width)  # A q_k's own coefficients: inside the band, rows near ... size - 1
        local = done[near:] @ w
        w -= done[near:].T @ local  # first along those few (cheap: most of A q_k is there),
        reduced = float(w.norm())
        coefficients = done @ w
        w -= done.T @ coefficients  # then full re-orthogonalisation,
        coefficients[near:] += local
        beta = float(w.norm())
        if beta < 0.7 * reduced:  # twice if cancellation lost accuracy (Daniel et al., 1976)
            again = done @ w
            w -= done.T @ again
            coefficients += again
            beta = float(w.norm())
        h[:size, k - 1] = coefficients.double().cpu().numpy()
        rows = np.arange(max(0, k - 1 - width), k)  # H_m's new row, inside the band
        band[k - 1 - rows, rows] = (h[k - 1, rows] + h[rows, k - 1]) / 2
        evals, evecs = _top_eigenpairs(band[: min(width, k - 1) + 1, :k], min(pairs, k))  # Rayleigh-Ritz
        theta, s = evals[-1], evecs[:, -1]
        if beta > 1e-12 * max(norm, abs(theta)):  # else A q_k lies in the space already
            if size == basis.shape[0]:
                basis = torch.cat([basis, torch.empty_like(basis[: min(size, maxiter + starts.shape[0] - size)])])
            torch.div(w, beta, out=basis[size])
            h[size, k - 1] = beta
            size += 1
        if float(np.linalg.norm(h[k:size, :k] @ s)) <= rtol * abs(theta):
            break
    top = torch.from_numpy(evecs[:, ::-1][:, : min(keep, k)].copy()).to(basis)
    ritz = top.T @ basis[:k]
    return torch.tensor(evals[-1], dtype=v0.dtype), ritz / ritz.norm(dim=1, keepdim=True), k


def _top_eigenpairs(band, count):
    """The ``count`` largest eigenvalues (ascending) and eigenvectors (columns) of a symmetric band matrix.

    ``band[d, j]`` is the entry ``(j + d, j)`` (LAPACK's lower band storage, ``d`` from 0 to
    the bandwidth). LAPACK's ``dsbevx`` (called directly: the checks of
    ``scipy.linalg.eig_banded`` cost more than the solve at these sizes) reduces the band to
    tridiagonal form, finds the eigenvalues by bisection to full accuracy (``abstol`` twice
    the underflow threshold) and their vectors by inverse iteration.
    """
    n = band.shape[1]
    values, vectors, found, _, info = dsbevx(band, 0.0, 0.0, n - count + 1, n, range=2, lower=1,
                                             abstol=2 * np.finfo(np.float64).tiny, mmax=count, overwrite_ab=0)
    if info != 0 or found != count:
        raise np.linalg.LinAlgError(f"dsbevx: info {info}, {found} of {count} eigenpairs")
    return values[:count], vectors


def power_max_eig(matvec, v0, rtol=1e-3, atol=1e-6, maxiter=100):
    """Return ``(λ, vector, iterations)`` by power iteration, as Cockpit's ``HessMaxEV(use_power=True)``.

    ``v ← A v / ‖A v‖`` with the Rayleigh quotient ``λ = vᵀ A v``, stopped when two
    consecutive quotients agree to ``|λ_k − λ_{k−1}| ≤ atol + rtol |λ_k|`` (Cockpit's
    ``torch.allclose`` rule). It converges to the eigenvalue of largest *magnitude* at
    the rate ``|λ₂/λ₁|`` and its stopping rule says nothing about the distance to it;
    ``lanczos_max_eig`` is the exact choice.

    Returns:
        The last quotient (0-d tensor), the last vector (normalised) and the number of
        products. A non-finite product returns NaN at once.
    """
    vector = v0 / v0.norm()
    value = None
    for k in range(1, maxiter + 1):
        product = matvec(vector)
        if not bool(torch.isfinite(product).all()):
            return torch.tensor(float("nan"), dtype=v0.dtype), vector, k
        new = torch.dot(vector, product)
        norm = product.norm()
        if float(norm) == 0.0:
            return new, vector, k
        vector = product / norm
        if value is not None and abs(float(new - value)) <= atol + rtol * abs(float(new)):
            return new, vector, k
        value = new
    return value, vector, maxiter
