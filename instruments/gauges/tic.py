"""TIC gauge: Takeuchi's information criterion, a generalisation-gap estimate.

``TICDiag`` = Σ_d E[g_{n,d}²] / (H_dd + ε) (diagonal approximation, blue) and
``TICTrace`` = Σ_d E[g_{n,d}²] / (tr H + ε) (trace approximation, orange): the
gradient noise measured in units of the curvature (Thomas et al. 2020). Thin
coloured lines: per-layer ``TICDiag`` values when ``layers=True`` and the record
has them.

How to read it
- Near a local minimum the TIC (divided by the number of training samples)
  estimates the generalisation gap, test loss − train loss: a larger TIC means
  more overfitting to expect. Far from a minimum it is only a trend indicator.
- Spikes come from tiny curvature (H_dd ≈ 0) in the denominator; compare the
  trend of the moving average (bold) rather than single values.
- TICTrace is smoother and cheaper; the two should move together.
The TICs are computed from exact curvature diagonals only; without one they are NaN
(the record's flag says why), and the title says "nan". Estimates (``Cockpit(samples=k)``:
from the drawn samples over the exact diagonal; a record written before that rule:
Hutchinson's) are shaded with their 95 % interval (``_common.estimate_band``), and the title
says so.
"""

import numpy as np

from .. import data, style
from ._common import estimate_band, finish_time_axes, layer_lines, missing, no_finite, not_tracked, raw_and_smooth

TITLE = "TIC"
KEYS = ("TICDiag", "TICTrace")
COLORS = {"TICDiag": style.PRIMARY, "TICTrace": style.SECONDARY}
LABELS = {"TICDiag": "diag", "TICTrace": "trace"}


def gauge(record, ax, *, layers=False, yscale="auto", **options):
    """Draw TICDiag and TICTrace over steps on ``ax``.

    Args:
        layers: add per-layer TICDiag values as thin lines.
        yscale: ``"auto"``, ``"linear"`` or ``"log"``.
    """
    absent = missing(record)(*KEYS)
    if len(absent) == len(KEYS):
        return not_tracked(ax, TITLE, KEYS)
    parts, shown, estimated = [], [], ""
    for key in KEYS:
        if key in absent:
            parts.append(f"{LABELS[key]} not tracked")
            continue
        xs, ys = data.finite(*data.series(record, key))
        if len(xs) == 0:
            parts.append(f"{LABELS[key]} nan")
            continue
        raw_and_smooth(ax, xs, ys, COLORS[key], label=LABELS[key], raw="line")
        shown.append(ys)
        parts.append(f"{LABELS[key]} {style.fmt(ys[-1])}")
        estimated = estimate_band(ax, record, key, COLORS[key]).replace(" · ", " ", 1) or estimated
    if not shown:
        return no_finite(ax, TITLE, KEYS, record)
    if layers:
        lx, matrix = data.layer_series(record, "TICDiag")
        if matrix.size:
            layer_lines(ax, lx, matrix, linewidth=0.6, alpha=0.6)
            shown.append(matrix[np.isfinite(matrix)])
    style.auto_yscale(ax, *shown, scale=yscale)
    finish_time_axes(ax, options, ylabel="TIC")
    style.legend(ax, loc="best", ncol=2)
    style.set_title(ax, f"TIC{estimated} " + " · ".join(parts))  # "est." first: a narrow panel cuts the end
