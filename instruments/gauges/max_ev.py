"""λmax gauge: the sharpest curvature of the mini-batch loss.

``HessMaxEV``: the largest eigenvalue λmax of the mini-batch Hessian (computed
iteratively from Hessian-vector products; usually tracked on a sparse, e.g.
logarithmic, schedule, so the points are marked). When the learning rate η is in
the record, the dashed line is 2/η, the stability limit of gradient descent on a
quadratic with curvature λmax.

How to read it
- λmax typically rises early in training ("progressive sharpening") and then
  hovers around 2/η ("edge of stability") for full-batch GD; for SGD it stays
  below it.
- λmax far above 2/η: steps along the sharpest direction overshoot; expect
  oscillation or divergence (compare the α gauge).
- A falling λmax: the optimiser moves into flatter regions (e.g. after a learning
  rate decay).
The axis switches to a log scale when the values span more than a factor of 30.
Values from Cockpit's power iteration (``HessMaxEV(use_power=True)``, ``meta.solver``
in the record) are labelled: it returns the eigenvalue of largest magnitude and its
stopping rule does not bound the error (Lanczos, the default, is converged to 1e-3).
"""

import numpy as np

from .. import data, style
from ._common import finish_time_axes, missing, no_finite, not_tracked

TITLE = "Largest Hessian eigenvalue λmax"
KEYS = ("HessMaxEV",)


def gauge(record, ax, *, yscale="auto", stability=True, **options):
    """Draw λmax over steps on ``ax``.

    Args:
        yscale: ``"auto"``, ``"linear"`` or ``"log"``.
        stability: draw 2/η where the learning rate η is logged.
    """
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    xs, ys = data.finite(*data.series(record, "HessMaxEV"))
    if len(xs) == 0:
        return no_finite(ax, TITLE, KEYS, record)
    ax.plot(xs, ys, color=style.TERTIARY, linewidth=1.6, marker="o" if len(xs) <= 30 else None, markersize=3,
            label="λmax")
    shown = [ys]
    title = f"λmax {style.fmt(ys[-1])} @ {int(xs[-1])}"
    solvers = {e.get("meta", {}).get("HessMaxEV", {}).get("solver") for e in record.values() if "HessMaxEV" in e}
    if "power" in solvers:
        title += " · power iteration (|λ| largest)"
    if stability:
        lx, lr = data.finite(*data.series(record, "learning_rate"))
        keep = lr > 0
        lx, lr = lx[keep], lr[keep]
        if len(lx):
            limit = 2.0 / lr
            title += f" · 2/η {style.fmt(limit[-1])}"
            if limit.min() <= 3 * ys.max():  # within reach: draw it and let it widen the axis
                x_end = max(xs[-1], lx[-1])
                ax.step(np.append(lx, x_end), np.append(limit, limit[-1]), where="post", color=style.REFERENCE,
                        linestyle="--", linewidth=1.0, label="2/η")
                shown.append(limit)
            else:  # far above the data: say so instead of squashing the curve
                ax.text(0.99, 0.97, f"2/η = {style.fmt(limit.min())} ↑ (off scale)", transform=ax.transAxes,
                        ha="right", va="top", fontsize=style.LEGEND_SIZE, color=style.REFERENCE)
    scale = style.auto_yscale(ax, *shown, scale=yscale)
    if scale == "linear" and ys.min() >= 0:
        ax.set_ylim(bottom=0)
    finish_time_axes(ax, options, ylabel="λmax")
    style.legend(ax, loc="best")
    style.set_title(ax, title)
