"""Distance & update size gauge: how far the parameters travel.

Left axis (bold black, thin coloured lines per layer): ``Distance`` = ‖θ_t − θ_0‖,
the L2 distance of the parameters from their initial values, total and per
parameter tensor. Right axis (black dots + dashed smoothed line): ``UpdateSize`` =
‖θ_{t+1} − θ_t‖, the length of a single step (total over all parameters).

How to read it
- Distance usually grows fast at first and then flattens as training settles; a
  distance that keeps growing linearly means the optimiser is still drifting (or
  weights are blowing up: check the per-layer lines to see which tensor).
- The update size follows the learning rate schedule times the gradient size; a
  sudden jump points at a gradient spike, a collapse to zero at a vanishing
  gradient or learning rate.
- A layer whose distance stays near zero is barely trained (frozen, dead units,
  too small a learning rate for it).
Both axes switch to a log scale when their values span more than a factor of 30.
"""

import numpy as np

from .. import data, style
from ._common import finish_time_axes, layer_lines, missing, no_finite, not_tracked, raw_and_smooth, total_line

TITLE = "Distance & update size"
KEYS = ("Distance", "UpdateSize")


def has_data(record):
    """Drawn where ``Distance`` is tracked (``UpdateSize`` alone is drawn per layer by ``update_ratio``)."""
    return bool(data.tracked(record, "Distance"))


def gauge(record, ax, *, layers=True, yscale="auto", **options):
    """Draw distance from initialisation (left) and update size (right) on ``ax``.

    Args:
        layers: draw per-layer distances as thin lines.
        yscale: ``"auto"``, ``"linear"`` or ``"log"`` for both axes.
    """
    absent = missing(record)(*KEYS)
    if len(absent) == len(KEYS):
        return not_tracked(ax, TITLE, KEYS)
    dist_x, dist_y = data.finite(*data.series(record, "Distance"))
    upd_x, upd_y = data.finite(*data.series(record, "UpdateSize"))
    if len(dist_x) == 0 and len(upd_x) == 0:
        return no_finite(ax, TITLE, KEYS, record)

    if "Distance" not in absent:
        lx, matrix = data.layer_series(record, "Distance")
        if layers and matrix.size and matrix.shape[1] > 1:
            layer_lines(ax, lx, matrix)
        total_line(ax, dist_x, dist_y, label="‖θ−θ₀‖ (left)")
        # log axes cannot show the zero distance at the first step
        shown = [dist_y[dist_y > 0]] + ([matrix[np.isfinite(matrix) & (matrix > 0)]] if matrix.size else [])
        scale = style.auto_yscale(ax, *shown, scale=yscale)
        finish_time_axes(ax, options, ylabel="‖θ−θ₀‖ (solid)")
        if scale == "log" and len(dist_y) and (dist_y > 0).any():
            ax.set_ylim(bottom=0.5 * dist_y[dist_y > 0].min())
    else:
        finish_time_axes(ax, options)
        ax.set_yticks([])
        ax.text(0.02, 0.95, "Distance not tracked", transform=ax.transAxes, fontsize=style.LEGEND_SIZE,
                va="top", color="#666666")

    if "UpdateSize" not in absent and len(upd_x):
        ax2 = ax.twinx()
        raw_and_smooth(ax2, upd_x, upd_y, style.TOTAL, label="‖Δθ‖ (right)", linestyle="--", linewidth=1.3)
        style.auto_yscale(ax2, upd_y[upd_y > 0], scale=yscale)
        ax2.tick_params(labelsize=style.TICK_SIZE, length=2.5, pad=1.5, axis="y")
        ax2.set_ylabel("‖Δθ‖ per step (dashed)", fontsize=style.LABEL_SIZE, labelpad=1)
        ax2.spines["top"].set_visible(False)
    elif "UpdateSize" in absent:
        ax.text(0.98, 0.05, "UpdateSize not tracked", transform=ax.transAxes, fontsize=style.LEGEND_SIZE,
                ha="right", color="#666666")

    dist_text = (style.fmt(dist_y[-1]) if len(dist_y) else "nan") if "Distance" not in absent else "not tracked"
    upd_text = (style.fmt(upd_y[-1]) if len(upd_y) else "nan") if "UpdateSize" not in absent else "not tracked"
    style.set_title(ax, f"Distance {dist_text} · update {upd_text}")
