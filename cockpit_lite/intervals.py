"""Intervals of estimates from their standard errors and degrees of freedom.

An estimate in the record (a subsample's, ``Cockpit(samples=k)``; Hutchinson's or the
Monte-Carlo GGN's) carries in its ``meta`` the standard error ``"se"`` (``"layers_se"`` per
layer), the degrees of freedom ``"df"`` it rests on, and, where the interval is not the plain
t-interval, ``"scale": "log"``. The interval of coverage ``c`` is, with ``q = t_df((1 + c)/2)``
the Student-t quantile:

- ``"linear"`` (the default): ``value ± q·se``. Hutchinson's and the Monte-Carlo GGN's
  estimates: means of independent draws, nearly symmetric.
- ``"log"``: ``value · exp(±q·se/value)``, the t-interval of ``log value`` with the delta-method
  standard error ``se/value``; for ``value = 0`` it is ``[0, q·se]``, for a negative value the
  mirror image. The subsample's estimates of totals of nonnegative per-sample terms
  (``NormTest``, ``InnerTest``, ``OrthoTest``, ``GradVariance``, ``CABS``): such a total estimated
  from a few samples is skewed to the right (a draw without the largest terms is low, and so
  is its standard error), and a symmetric interval misses low draws far more often than its
  coverage says; on the log scale it is nearly symmetric.

``Alpha`` records its interval itself (``"interval": [low, high]`` at ``"coverage"``, this
module's ``COVERAGE`` when it was computed): a function of the slopes' variances at both
ends of the step that no scale of ``se`` describes (``cockpit_lite.quantities.alpha``).

Imports neither torch nor the rest of ``cockpit_lite``: the ``instruments`` use it.
"""

import math

import numpy as np
from scipy import special

COVERAGE = 0.95
"""The coverage of recorded intervals (``Alpha``'s) and of the dashboard's band."""

LOG = "log"
"""``meta["scale"]`` of an estimate whose interval is formed on the log scale."""


def quantile(df, coverage=None):
    """``t_df((1 + coverage)/2)``: the half-width of the interval in standard errors (``coverage``
    by default ``COVERAGE``). ``df`` of ``None`` (a record without it) takes the normal quantile."""
    p = (1 + (COVERAGE if coverage is None else coverage)) / 2
    if df is None or not math.isfinite(df):
        return float(special.ndtri(p))
    return float(special.stdtrit(df, p))


def interval(value, se, df, coverage=None, scale=None):
    """``(low, high)`` of an estimate ``value`` with standard error ``se`` on ``df`` degrees of
    freedom (see the module docstring); arrays element-wise. NaN where ``se`` is NaN."""
    q = quantile(df, coverage)
    value, se = np.asarray(value, dtype=float), np.asarray(se, dtype=float)
    if scale != LOG:
        return value - q * se, value + q * se
    size = np.abs(value)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        spread = np.exp(q * se / size)
        low = np.where(size > 0, size / spread, 0.0)
        high = np.where(size > 0, size * spread, q * se)
    low, high = np.where(value < 0, -high, low), np.where(value < 0, -low, high)
    return np.where(np.isnan(value), np.nan, low), np.where(np.isnan(value), np.nan, high)
