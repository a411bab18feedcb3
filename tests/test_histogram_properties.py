"""Property-based tests of the histogram kernel against numpy (hypothesis).

Values include ±0, subnormals, ±Inf, NaN, values exactly on the edges and their float
neighbours; ranges, bin counts and scales are random.

- Dyadic ranges (``g = scale · bins / (hi − lo)`` a power of two ≥ 1, ``lo · g`` an
  integer): ``t`` is exact, and the module docstring promises numpy's rule exactly,
  so counts, ``clipped`` and ``nonfinite`` must equal numpy's.
- Any range, bin count and scale: a value may move to a neighbouring bin only if it
  lies within a few units of rounding of an edge (the docstring's caveat).
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cockpit_lite.histogram import histogram1d, histogram1d_batch, histogram2d

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 2.2250738585072014e-308, -1e-310]


def reference_1d(u, bins, range, scale=1.0):
    """numpy.histogram of the finite ``scale · u`` clipped into the range; clipped and non-finite counts.

    ``scale`` a power of two: ``u`` is binned on ``range / scale`` (exact), never multiplied
    (the product could underflow).
    """
    range = (range[0] / scale, range[1] / scale)
    u = np.asarray(u, dtype=np.float64)
    finite = u[np.isfinite(u)]
    counts, _ = np.histogram(np.clip(finite, *range), bins=bins, range=range)
    clipped = int(((finite < range[0]) | (finite > range[1])).sum())
    return counts, clipped, int((~np.isfinite(u)).sum())


def values_for(edges, magnitude, dtype):
    """Arrays mixing random floats, the special values, the edges and their neighbours."""
    info = np.finfo(dtype)
    near = [float(x) for e in edges for x in (e, np.nextafter(dtype(e), dtype(-np.inf)), np.nextafter(dtype(e), dtype(np.inf)))]
    special = [float(dtype(s)) for s in SPECIAL]
    element = st.one_of(
        st.floats(-float(dtype(magnitude)), float(dtype(magnitude)), allow_subnormal=True, width=info.bits),
        st.sampled_from(special + near),
    )
    return st.lists(element, min_size=0, max_size=200).map(lambda xs: np.array(xs, dtype=dtype))


@st.composite
def dyadic_case(draw, dtype=np.float64, scaled=True):
    """(values, bins, range, scale) with exact arithmetic and a range containing 0 (``scale`` 1 unless ``scaled``).

    ``g ≥ 1``: with ``g < 1`` a subnormal ``v · g`` underflows, ``t`` is not exact, and a
    value of -5e-324 lands right of an edge at 0 (the caveat of the module docstring).
    """
    a, b = draw(st.integers(0, 6)), draw(st.integers(0, 6))
    if a + b == 0:
        b = 1
    e = draw(st.integers(-3, 3))  # lo = -a 2^e, hi = b 2^e
    j = draw(st.integers(0, 3))  # bins = (a + b) 2^j
    if not scaled:
        e = min(e, j)
    s = draw(st.integers(e - j, e - j + 3)) if scaled else 0  # scale = 2^s, so that g = 2^(s + j - e) >= 1
    bins, range, scale = (a + b) * 2**j, (-a * 2.0**e, b * 2.0**e), 2.0**s
    edges = np.linspace(*range, bins + 1) / scale
    magnitude = 1e30 if dtype == np.float32 else 1e300
    values = draw(values_for(edges, magnitude / scale / 2**(s + j - e), dtype))
    return values, bins, range, scale


@SETTINGS
@given(st.one_of(dyadic_case(), dyadic_case(dtype=np.float32)))
def test_dyadic_1d_equals_numpy_exactly(case):
    """float64 and float32 values."""
    values, bins, range, scale = case
    counts, clipped, nonfinite = histogram1d(torch.from_numpy(values), bins, range, scale=scale)
    expected = reference_1d(values, bins, range, scale)
    np.testing.assert_array_equal(counts.numpy(), expected[0])
    assert (int(clipped), int(nonfinite)) == expected[1:]


@SETTINGS
@given(st.lists(dyadic_case(), min_size=1, max_size=4))
def test_batch_rows_equal_numpy(cases):
    """``histogram1d_batch``: row i is numpy's histogram of tensor i (one bins/range/scale for all)."""
    _, bins, range, scale = cases[0]
    tensors = [torch.from_numpy(values) for values, *_ in cases]
    counts, clipped, nonfinite = histogram1d_batch(tensors, bins, range, scale=scale)
    for i, t in enumerate(tensors):
        c, cl, nf = reference_1d(t.numpy(), bins, range, scale)
        np.testing.assert_array_equal(counts[i].numpy(), c)
        assert (int(clipped[i]), int(nonfinite[i])) == (cl, nf)


@st.composite
def any_case(draw):
    """Any range (also far from 0), any bin count, any positive scale, finite moderate values."""
    lo = draw(st.floats(-1e3, 1e3))
    width = draw(st.floats(1e-3, 1e3))
    bins = draw(st.integers(1, 300))
    scale = draw(st.sampled_from([None, 1.0, 3.0, 0.1, 7.5, 64.0]))
    range = (lo, lo + width)
    factor = 1.0 if scale is None else scale
    edges = np.linspace(*range, bins + 1) / factor
    center, spread = (lo + width / 2) / factor, 2 * width / factor
    randoms = st.floats(center - spread, center + spread)
    element = st.one_of(randoms, st.sampled_from([float(e) for e in edges] + SPECIAL))
    values = draw(st.lists(element, max_size=200).map(lambda xs: np.array(xs, dtype=np.float64)))
    return values, bins, range, scale


def assert_near_edges_only(counts, clipped, nonfinite, u, bins, range, delta):
    """Counts between those of ``u`` moved by ±δ elementwise toward each neighbouring bin."""
    finite = np.isfinite(u)
    assert int(nonfinite) == int((~finite).sum())
    u, delta = u[finite], delta[finite]
    assert int(counts.sum()) == len(u)
    edges = np.linspace(*range, bins + 1)
    index = lambda v: np.clip(np.searchsorted(edges, v, side="right") - 1, 0, bins - 1)  # noqa: E731
    low, high = index(u - delta), index(u + delta)
    lower = np.bincount(low[low == high], minlength=bins)
    upper = lower + np.bincount(low[low != high], minlength=bins) + np.bincount(high[low != high], minlength=bins)
    counts = counts.numpy()
    assert (counts >= lower).all() and (counts <= upper).all(), (counts, lower, upper)
    surely = int(((u + delta < range[0]) | (u - delta > range[1])).sum())
    maybe = int(((u - delta < range[0]) | (u + delta > range[1])).sum())
    assert surely <= int(clipped) <= maybe


@SETTINGS
@given(any_case())
def test_any_range_1d_matches_numpy_up_to_edge_rounding(case):
    values, bins, range, scale = case
    counts, clipped, nonfinite = histogram1d(torch.from_numpy(values), bins, range, scale=scale)
    u = values * (1.0 if scale is None else scale)
    delta = 64 * np.finfo(np.float64).eps * (np.abs(u) + abs(range[0]) + abs(range[1]))
    assert_near_edges_only(counts, clipped, nonfinite, u, bins, range, delta)


@SETTINGS
@given(dyadic_case(), dyadic_case(scaled=False))
def test_dyadic_2d_equals_numpy_exactly(xcase, ycase):
    """Pairs (scale·x, y); a pair with a non-finite coordinate is non-finite, with an outside one clipped."""
    x, bx, xrange, scale = xcase
    y, by, yrange, _ = ycase
    n = min(len(x), len(y))
    x, y = x[:n], y[:n]
    counts, clipped, nonfinite = histogram2d(
        torch.from_numpy(x), torch.from_numpy(y), (bx, by), (xrange, yrange), scale=scale
    )
    xrange_u = (xrange[0] / scale, xrange[1] / scale)  # exact: scale is a power of two
    u = x
    finite = np.isfinite(u) & np.isfinite(y)
    uf, yf = u[finite], y[finite]
    expected, _, _ = np.histogram2d(
        np.clip(uf, *xrange_u), np.clip(yf, *yrange), bins=(bx, by), range=(xrange_u, yrange)
    )
    outside = (uf < xrange_u[0]) | (uf > xrange_u[1]) | (yf < yrange[0]) | (yf > yrange[1])
    np.testing.assert_array_equal(counts.numpy(), expected.astype(np.int64))
    assert (int(clipped), int(nonfinite)) == (int(outside.sum()), int((~finite).sum()))


@pytest.mark.parametrize("bins", [1, 3, 100])
def test_every_special_value_once(bins):
    """The special values alone, on a range containing 0 (also a regression example for hypothesis)."""
    values = np.array(SPECIAL)
    counts, clipped, nonfinite = histogram1d(torch.from_numpy(values), bins, (-1.0, 1.0))
    expected = reference_1d(values, bins, (-1.0, 1.0))
    np.testing.assert_array_equal(counts.numpy(), expected[0])
    assert (int(clipped), int(nonfinite)) == expected[1:]
