"""Heat maps of a per-layer signal over steps (rows: layers, columns: steps); not a gauge itself.

Readable at any size: more than ``MAX_COLUMNS`` recorded steps are averaged into that
many equal step bins (a geometric mean for log-scaled values), and more than
``MAX_LABELS`` rows get evenly spaced labels, so a 10,000-step run of a 100-layer
model is still a picture and not a smear. Cells are as wide as the steps they cover
(a dense start and a sparse schedule later are drawn on one true step axis).
"""

import numpy as np
from matplotlib import colormaps, colors

from .. import style

MAX_COLUMNS = 300
MAX_LABELS = 16


def _edges(xs):
    """Cell edges around sorted step positions (midpoints; the ends half a gap out)."""
    if len(xs) == 1:
        return np.array([xs[0] - 0.5, xs[0] + 0.5])
    mids = (xs[1:] + xs[:-1]) / 2
    return np.concatenate([[xs[0] - (mids[0] - xs[0])], mids, [xs[-1] + (xs[-1] - mids[-1])]])


def binned(xs, matrix, log=False, columns=MAX_COLUMNS):
    """``(edges, matrix)``: at most ``columns`` columns, each the (geometric) mean of its steps.

    ``matrix`` is ``[rows, len(xs)]`` with NaN where a value is missing.
    """
    xs = np.asarray(xs, dtype=float)
    if len(xs) <= columns:
        return _edges(xs), matrix
    edges = np.linspace(xs[0], xs[-1] + 1, columns + 1)
    which = np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, columns - 1)
    values = np.log(matrix) if log else matrix
    out = np.full((matrix.shape[0], columns), np.nan)
    for j in range(columns):
        block = values[:, which == j]
        if block.size:
            with np.errstate(all="ignore"):
                finite = np.isfinite(block)
                counts = finite.sum(1)
                sums = np.where(finite, block, 0.0).sum(1)
                out[:, j] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return edges, (np.exp(out) if log else out)


def draw(ax, xs, matrix, labels, *, log=False, vmin=None, vmax=None, cmap="viridis", label="",
         threshold=None, threshold_label=None, zero_label="0", options=None):
    """Draw ``matrix`` (``[rows, steps]``) as a heat map with a colour bar; returns the mesh.

    The colour bar's label says what the colours outside the scale mean, where the map has
    them: black (a value ≤ 0 on a log scale: ``zero_label``) and grey (no value).

    Args:
        log: logarithmic colour scale; values ≤ 0 are drawn in the "under" colour (black).
        vmin, vmax: colour limits (default: the 1st and 99th percentile of the finite values).
        threshold: a value marked on the colour bar (e.g. a diagnosis threshold).
        zero_label: what a black cell means (e.g. "no gradient").
    """
    options = options or {}
    matrix = np.asarray(matrix, dtype=float)
    finite = matrix[np.isfinite(matrix)]
    positive = finite[finite > 0]
    cm = colormaps[cmap].with_extremes(bad=style.MISSING_FACE, under="black" if log else None)
    if log:
        lo = vmin if vmin is not None else (np.percentile(positive, 1) if positive.size else 1e-6)
        hi = vmax if vmax is not None else (np.percentile(positive, 99) if positive.size else 1.0)
        hi = max(hi, lo * 10)
        norm = colors.LogNorm(vmin=lo, vmax=hi)
        # values outside the colour range take its end colours; only a value <= 0 is drawn black
        shown = np.where(np.isfinite(matrix) & (matrix <= 0), lo * 1e-3, np.clip(matrix, lo, hi))
    else:
        lo = vmin if vmin is not None else (float(finite.min()) if finite.size else 0.0)
        hi = vmax if vmax is not None else (float(finite.max()) if finite.size else 1.0)
        norm = colors.Normalize(vmin=lo, vmax=hi if hi > lo else lo + 1)
        shown = matrix
    edges, cells = binned(xs, shown, log=log)
    rows = np.arange(len(labels) + 1) - 0.5
    mesh = ax.pcolormesh(edges, rows, np.ma.masked_invalid(cells), cmap=cm, norm=norm, shading="flat",
                         rasterized=True)
    style.style_axes(ax, grid=False)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first layer on top
    _row_labels(ax, labels)
    style.step_axis(ax, options.get("log_steps", False), label=options.get("step_label", True))
    span = options.get("step_range")
    if span is not None:
        first, last = span
        pad = max(0.5, 0.02 * (last - first))
        ax.set_xlim(first - (0 if options.get("log_steps") else pad), last + pad)
    bar = ax.figure.colorbar(mesh, ax=ax, fraction=0.05, pad=0.015, aspect=18,
                             extend="min" if log and (finite <= 0).any() else "neither")
    if log:  # plain tick labels (10, 0.01, 1e-4), never mathtext: text may be drawn literally
        style.log_ticks(bar.ax.yaxis)
    else:
        style.compact_yaxis(bar.ax)
    bar.ax.tick_params(which="both", labelsize=style.COLORBAR_SIZE, length=2, pad=1)  # minor labels too
    marked = threshold is not None and norm.vmin < threshold < norm.vmax
    if marked:
        bar.ax.axhline(threshold, color=style.FLAG, linewidth=1.5)
    keys = [f"red: {threshold_label}"] if marked and threshold_label else []
    keys += [f"black: {zero_label}"] if log and (finite <= 0).any() else []
    keys += ["grey: no value"] if np.isnan(cells).any() else []
    text = "\n".join(part for part in (label, " · ".join(keys)) if part)
    if text:
        bar.set_label(text, fontsize=style.COLORBAR_SIZE, labelpad=1)
    return mesh


def _row_labels(ax, labels):
    n = len(labels)
    if n <= MAX_LABELS:
        shown = list(range(n))
    else:
        shown = sorted(set(np.linspace(0, n - 1, MAX_LABELS // 2).round().astype(int).tolist()))
    ax.set_yticks(shown)
    width = 20
    ax.set_yticklabels([f"{i}: {style.short_name(labels[i], width)}" if n > MAX_LABELS else
                        style.short_name(labels[i], width) for i in shown], fontsize=style.TICK_SIZE - 0.5)
    if n > MAX_LABELS:
        ax.set_ylabel(f"{n} layers (every {max(1, (n - 1) // (len(shown) - 1))}th labelled)",
                      fontsize=style.LEGEND_SIZE, labelpad=1)


def worst(matrix, labels, largest=True):
    """``(label, value)`` of the row with the largest (or smallest) last finite value."""
    last = np.full(matrix.shape[0], np.nan)
    for i, row in enumerate(matrix):
        row = row[np.isfinite(row)]
        if row.size:
            last[i] = row[-1]
    if not np.isfinite(last).any():
        return None, float("nan")
    i = int(np.nanargmax(last) if largest else np.nanargmin(last))
    return labels[i], float(last[i])
