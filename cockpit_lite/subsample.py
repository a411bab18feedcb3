"""Subsampled estimates: per-sample quantities from k of a batch's B samples (``Cockpit(samples=k)``).

At a tracked step with ``B > k``, the Cockpit draws a uniform subsample ``S`` of ``k``
distinct samples (``draw``: its own generator, seeded by ``(seed, step)``; the user's
random state is untouched). The engine forms the individual gradients of those ``k``
samples only (on the global path, k vector-Jacobian products instead of B); the batch
gradient ``g`` stays autograd's, exact (``cockpit_lite.engine``: a rule-served parameter's
transforms that read it wait for autograd to accumulate it). A quantity that supports it
(``Quantity.SUBSAMPLE``) estimates its value from the subsample; the others are NaN with
a flag at such steps.

Estimator (simple random sampling without replacement). Every supported quantity is a
function of exact terms (``B``, ``g``) and of population totals ``T = Σ_n x_n`` of a
per-sample value ``x_n`` (``‖g̃_n‖²``, ``(g̃_nᵀg − ‖g‖²)²``, ...). With ``f = k / B``,

- ``T̂ = (B / k) Σ_{n∈S} x_n`` is unbiased: ``E[T̂] = T``;
- ``Var(T̂) = B² (1 − f) s² / k`` with ``s²`` the population variance (``B − 1``
  denominator) of the ``x_n``; replacing ``s²`` by the sample variance of the ``x_n``
  over ``S`` (``k − 1`` denominator) is unbiased for it, and its square root is the
  standard error ``se(T̂)`` (``total``). It rests on ``k − 1`` degrees of freedom: for
  normal ``x_n`` ``(T̂ − T) / se`` is about Student's t with ``k − 1`` degrees, so even
  then ``|T̂ − T| > 3 se`` in 2.0 % of draws at ``k = 8``, 0.9 % at 16, 0.5 % at 32.
- A smooth function ``h(T̂)`` (a square root, a ratio with an exact denominator) has the
  delta-method standard error ``|h'(T̂)| se(T̂)`` (``sqrt_se``); it is consistent, not
  unbiased: ``h`` concave or convex biases it by ``O(1/k)``, ``E h(T̂) ≈ h(T) + h''(T)
  Var(T̂)/2``. For the square root ``v = √U`` of ``U = (T̂ − offset)/D`` ``sqrt_estimates``
  removes it by the finite-population jackknife: ``v − (1 − f)(k − 1)(mean_i v_(i) − v)``
  with ``v_(i)`` the root of the estimate from the subsample without sample ``i`` (the
  jackknife's bias estimate is ``(k − 1)(mean_i v_(i) − v)`` for draws with replacement; the
  bias of ``h`` scales with ``Var(T̂)``, which sampling without replacement shrinks by
  ``1 − f``), clamped at 0. On heavy-tailed terms it removes more than the second-order
  term ``v (1 + c²/8)``, ``c = se(U)/U``, that an earlier version added
  (``experiments.subsample_honesty``: the largest bias over the standard error of a mean of
  100 draws, ``InnerTest`` at 8 of 64, 4.6 → 3.7 on a character GPT, 3.8 → 3.1 on a ResNet).

Intervals (``cockpit_lite.intervals``). The record's ``meta`` keeps each standard error and
the degrees of freedom it rests on, ``"df": k − 1``. Every estimated total here is a sum of
nonnegative per-sample terms (``‖g̃_n‖²``, ``‖g̃_n − g‖²``, ``(g̃_nᵀg − ‖g‖²)²``, ...): from a few
samples it is skewed to the right, and a draw that misses the largest terms is low and has a
small standard error. A symmetric interval ``value ± t·se`` then misses the exact value on the
low side far more often than its coverage says (squared normal terms, ``k = 8``, the 99.73 %
t-interval: 5.9 % of draws); the interval of the log of the value, ``value · exp(±t·se/value)``,
is nearly symmetric (0.9 %). The estimates of such totals and of their square roots therefore
record ``"scale": "log"`` (``intervals.interval`` forms the interval). What no interval from
``k`` samples can cover is a term that none of them saw: where one sample holds a large share of
the batch's total, the draws without it lie below their interval
(``experiments.subsample_honesty``; docs/performance.md).
"""

import hashlib
import math

import torch

from cockpit_lite import intervals
from cockpit_lite.output import Output

MIN_SAMPLES = 2
"""The smallest ``k``: a standard error needs a variance across the subsample."""


def seed_of(*key):
    """A seed for a private ``torch.Generator`` from ``key`` (ints and strings): SHA-256 of its
    ``repr``, not Python's ``hash``, which is salted per process for strings, so the same key
    gives the same seed in every run and process."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def draw(k, batch_size, key, device=None):
    """``k`` distinct sample indices out of ``batch_size``, sorted, from a generator seeded by ``key``.

    ``key`` (a tuple of ints, e.g. ``(seed, step)``) is hashed (``seed_of``) into the seed of a
    private ``torch.Generator``: the same key draws the same samples in every run and process,
    and no global random state is read or advanced.
    """
    generator = torch.Generator().manual_seed(seed_of("samples", *(int(k) for k in key)))
    chosen = torch.randperm(batch_size, generator=generator)[:k].sort().values
    return chosen if device is None else chosen.to(device)


def total(values, batch_size):
    """``(T̂, se)``: the estimate of ``Σ_n x_n`` over the batch and its standard error.

    Args:
        values: ``[k, ...]``, the per-sample values ``x_n`` of the subsample (totals of
            several elements along the other axes).
        batch_size: ``B``.
    """
    k = values.shape[0]
    estimate = values.sum(0) * (batch_size / k)
    variance = values.var(0) if k > 1 else torch.full_like(estimate, float("nan"))
    se = batch_size * ((1 - k / batch_size) * variance / k).clamp(min=0).sqrt()
    return estimate, se


def sqrt_se(value, scaled_se):
    """Delta-method standard error of ``value = sqrt(u)`` given ``se(u)`` (``scaled_se``):
    ``se(u) / (2 sqrt(u))``; where ``u`` is 0 the bound ``sqrt(se(u))`` (a value within one
    standard error of zero)."""
    return torch.where(value > 0, scaled_se / (2 * value.clamp(min=1e-300)), scaled_se.sqrt())


def jackknife_se(leave_one_out, batch_size):
    """The standard error from a statistic's leave-one-out values over the subsample,
    ``sqrt((1 − k/B) (k − 1)/k Σ_i (θ_(i) − θ̄)²)`` (the finite-population jackknife)."""
    values = [v for v in leave_one_out if math.isfinite(v)]
    k = len(leave_one_out)
    if len(values) < k or k < 2:
        return float("nan")
    mean = sum(values) / k
    spread = sum((v - mean) ** 2 for v in values)
    return math.sqrt(max(0.0, (1 - k / batch_size) * (k - 1) / k * spread))


def sqrt_estimates(columns, batch_size, offsets, denominators):
    """The ``Output`` of ``v_j = sqrt(U_j)``, ``U_j = max(T̂_j − offset_j, 0) / denominator_j``, for the
    estimated totals ``T̂_j`` of the columns of ``columns`` (``[k, 1 + L]``: the whole network's
    per-sample values, then each parameter's), exact ``offsets`` and ``denominators``
    (``[1 + L]``), with the delta-method standard errors; all columns in a few tensor operations.

    Each value carries the finite-population jackknife's bias correction of the root,
    ``max(v_j − (1 − f)(k − 1)(mean_i v_(i)j − v_j), 0)``, ``v_(i)j`` the root of the total
    estimated without sample ``i``, ``(B/(k − 1)) Σ_{n∈S, n≠i} x_n``; the standard error is the
    delta method's at ``v_j``."""
    k = columns.shape[0]
    t, se = total(columns, batch_size)
    u, se_u = (t - offsets).clamp(min=0) / denominators, se / denominators
    values = u.sqrt()
    left_out = ((columns.sum(0) - columns) * (batch_size / max(k - 1, 1)) - offsets).clamp(min=0) / denominators
    bias = (1 - k / batch_size) * (k - 1) * (left_out.sqrt().mean(0) - values)
    return output((values - bias).clamp(min=0), sqrt_se(values, se_u), k, batch_size, scale=intervals.LOG)


def output(values, ses, k, batch_size, scale=None):
    """The ``Output`` of estimates ``values`` and standard errors ``ses`` (``[1 + L]``: the whole
    network's first, then one per parameter); ``scale`` that of their intervals
    (``intervals.LOG`` for totals of nonnegative terms and their roots, else ``None``: linear)."""
    return Output(values[0], list(values[1:].unbind()),
                  meta=meta(k, batch_size, ses[0], list(ses[1:].unbind()), scale=scale))


def meta(k, batch_size, se, layers_se=None, scale=None, df=None):
    """The record's ``meta`` of an estimate from ``k`` of ``batch_size`` samples: the standard
    errors, their degrees of freedom (``df``, by default ``k − 1``) and the interval's ``scale``
    (``cockpit_lite.intervals``; left out when linear)."""
    out = {"samples": int(k), "of": int(batch_size), "se": se, "df": int(k) - 1 if df is None else df}
    if layers_se is not None:
        out["layers_se"] = layers_se
    if scale is not None:
        out["scale"] = scale
    return out
