"""Largest eigenvalue of a symmetric operator from matrix-vector products (Lanczos).

``lanczos_max_eig(matvec, v0)`` builds the Krylov basis ``v0, Av0, A²v0, ...`` with
full re-orthogonalisation, so that ``Qᵀ A Q = T`` is tridiagonal, and stops as soon as
the largest Ritz value θ (largest eigenvalue of T) has a residual bound
``‖A y − θ y‖ = |β_k s_k| ≤ rtol · |θ|`` (``y = Q s`` its Ritz vector). For a
symmetric A some eigenvalue lies within that bound of θ, and θ never exceeds
``λ_max`` (Cauchy interlacing), so a converged θ is ``λ_max`` to relative accuracy
``rtol`` once Lanczos has found the top of the spectrum. It converges in far fewer
products than power iteration, which needs ``log(ε)/log(λ₂/λ₁)`` of them. A start
vector in the span of the previous step's top Ritz vectors makes it faster still;
using several of them (not just the top one) keeps Lanczos from settling on the old
top eigenvector when two eigenvalues swap places between steps: a start vector that
is nearly an eigenvector has a tiny residual from the first product on, whatever
its eigenvalue.
"""

import math

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal


def lanczos_max_eig(matvec, v0, rtol=1e-3, maxiter=100, keep=3):
    """Return ``(λ_max, Ritz vectors, iterations)`` of the symmetric operator ``matvec``.

    Args:
        matvec: function mapping a vector (1-d tensor) to ``A @ vector``.
        v0: start vector (not necessarily normalised, nonzero).
        rtol: relative residual tolerance for convergence.
        maxiter: maximal number of products; the last estimate is returned if it is
            reached (the residual then exceeds ``rtol``).

        keep: number of top Ritz vectors to return.

    Returns:
        The largest eigenvalue estimate (0-d tensor), the top ``keep`` Ritz vectors
        (rows of a matrix, normalised, the first belongs to the estimate) and the
        number of products used. A non-finite product returns NaN at once.
    """
    basis = v0.new_empty((min(maxiter + 1, 16), v0.numel()))  # rows q_1, q_2, ...; grows by doubling
    basis[0] = v0 / v0.norm()
    alphas, betas = [], []  # T's diagonal and off-diagonal, on the host (T is tiny)
    for k in range(1, maxiter + 1):
        q, done = basis[k - 1], basis[:k]
        w = matvec(q)
        norm = float(w.norm())
        if not math.isfinite(norm):
            if not bool(torch.isfinite(w).all()):
                return torch.tensor(float("nan"), dtype=v0.dtype), basis[:1].clone(), k
            norm = float(w.double().norm())  # finite, but the norm overflowed the dtype
        alphas.append(float(torch.dot(w, q)))
        w -= done.T @ (done @ w)  # full re-orthogonalisation,
        beta = float(w.norm())
        if beta < 0.7 * norm:  # twice if cancellation lost accuracy (Daniel et al., 1976)
            w -= done.T @ (done @ w)
            beta = float(w.norm())
        if betas:
            evals, evecs = eigh_tridiagonal(np.array(alphas), np.array(betas))
        else:
            evals, evecs = np.array(alphas), np.ones((1, 1))
        theta, s = evals[-1], evecs[:, -1]
        scale = abs(theta)
        residual = abs(beta * s[-1])
        if residual <= rtol * scale or beta <= 1e-12 * scale:
            break
        betas.append(beta)
        if k == basis.shape[0]:
            basis = torch.cat([basis, torch.empty_like(basis[: min(k, maxiter + 1 - k)])])
        basis[k] = w / beta
    top = torch.from_numpy(evecs[:, ::-1][:, : min(keep, k)].copy()).to(basis)
    ritz = top.T @ basis[:k]
    return torch.tensor(theta, dtype=v0.dtype), ritz / ritz.norm(dim=1, keepdim=True), k


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
