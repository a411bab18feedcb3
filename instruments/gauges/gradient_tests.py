"""Gradient tests gauge: is the mini-batch gradient precise enough?

Three statistics (Byrd et al. 2012; Bollapragada et al. 2017), each normalised so
that the decision threshold is 1 (dashed line), drawn over steps on a log axis
(thin: raw, bold: moving average):

- norm test (blue) ``NormTest`` = sqrt(Σ_n ‖g_n − g‖² / ((B−1) B ‖g‖²)): the
  standard error of the mini-batch gradient relative to its length;
- inner-product test (orange) ``InnerTest``: spread of the individual gradients
  along the mean gradient, i.e. how reliably the step is a descent direction;
- orthogonality test (green) ``OrthoTest``: spread orthogonal to the mean
  gradient, i.e. how much the direction itself is noise.

How to read it
- All below 1: the gradient is well determined; the batch could be smaller.
- Above 1 (shaded): gradient noise dominates the signal. Norm test > 1 means a
  larger batch (or a smaller learning rate) would help; it rises naturally late in
  training as the gradient shrinks towards the noise floor.
- Inner test > 1: steps are not reliably downhill; ortho test > 1 with a small
  inner test: the direction wobbles but progress along it is reliable.
Cockpit draws the same three numbers as a circle and two bands around a cross;
time series are easier to compare across steps, so this gauge draws those.
With ``layers="NormTest"`` (or another test) the per-layer values of that test are
added as thin lines, where the record has them. Values estimated from a subsample of
the batch (``Cockpit(samples=k)``) are shaded with their 95 % interval (Student's t of the
recorded degrees of freedom, on the log scale: ``_common.estimate_band``) and the title says
"est." with the number of samples.
"""

import numpy as np

from .. import data, style
from ._common import estimate_band, finish_time_axes, layer_lines, missing, no_finite, not_tracked, raw_and_smooth

TITLE = "Gradient tests"
KEYS = ("NormTest", "InnerTest", "OrthoTest")
COLORS = {"NormTest": style.PRIMARY, "InnerTest": style.SECONDARY, "OrthoTest": style.TERTIARY}
STYLES = {"NormTest": "-", "InnerTest": "-", "OrthoTest": "--"}  # ortho often lies on top of norm
LABELS = {"NormTest": "norm", "InnerTest": "inner", "OrthoTest": "ortho"}


def gauge(record, ax, *, layers=None, yscale="log", threshold=1.0, **options):
    """Draw the three gradient tests over steps on ``ax``.

    Args:
        layers: name of one test whose per-layer values to add as thin lines.
        yscale: ``"log"`` (default), ``"linear"`` or ``"auto"``.
        threshold: the reference level (1 in the normalisation used here).
    """
    absent = missing(record)(*KEYS)
    if len(absent) == len(KEYS):
        return not_tracked(ax, TITLE, KEYS)
    drawn, parts, all_values = 0, [], []
    for key in KEYS:
        if key in absent:
            parts.append(f"{LABELS[key]} –")
            continue
        xs, ys = data.finite(*data.series(record, key))
        if yscale == "log":
            xs, ys = xs[ys > 0], ys[ys > 0]
        if len(xs) == 0:
            parts.append(f"{LABELS[key]} nan")
            continue
        raw_and_smooth(ax, xs, ys, COLORS[key], label=LABELS[key], raw="line", linestyle=STYLES[key])
        all_values.append(ys)
        parts.append(f"{LABELS[key]} {style.fmt(ys[-1], 2)}")
        drawn += 1
        if layers == key:
            lx, matrix = data.layer_series(record, key)
            if matrix.size:
                if yscale == "log":
                    matrix = np.where(matrix > 0, matrix, np.nan)
                layer_lines(ax, lx, matrix, linewidth=0.6, alpha=0.6)
    if not drawn:
        return no_finite(ax, TITLE, KEYS, record)
    ax.axhline(threshold, color=style.REFERENCE, linestyle="--", linewidth=1.0, zorder=0)
    ax.axhspan(threshold, max(threshold, *(v.max() for v in all_values)) * 10, color=style.FLAG, alpha=0.05,
               zorder=0)
    style.auto_yscale(ax, *all_values, np.array([threshold]), scale=yscale)
    estimated = [estimate_band(ax, record, key, COLORS[key], label=i == 0)
                 for i, key in enumerate(k for k in KEYS if k not in absent)]
    estimated = next((e for e in estimated if e), "")
    low = min(v.min() for v in all_values)
    high = max(v.max() for v in all_values)
    if ax.get_yscale() == "log":
        ax.set_ylim(min(low, threshold) / 1.6, max(high, threshold) * 1.6)
    else:
        ax.set_ylim(min(0, low), max(high, threshold) * 1.1)
    finish_time_axes(ax, options, ylabel="test / threshold")
    ax.text(0.99, 0.98, "> 1: noise dominates", transform=ax.transAxes, fontsize=style.LEGEND_SIZE,
            color=style.FLAG, ha="right", va="top", alpha=0.8)
    style.legend(ax, loc="lower left", ncol=3)
    style.set_title(ax, "tests: " + " · ".join(parts) + estimated)
