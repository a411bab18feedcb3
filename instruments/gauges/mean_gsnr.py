"""Mean GSNR gauge: gradient signal-to-noise ratio.

``MeanGSNR`` = mean over coordinates d of g_d² / (σ_d² + ε), where g_d is the
mini-batch mean gradient and σ_d² the variance of the individual gradients
(Liu et al. 2020). Raw values as dots, moving average bold; per-layer values as
thin coloured lines where the record has them. The dashed line marks GSNR = 1.

How to read it
- GSNR ≫ 1: the samples agree on the gradient direction (signal dominates).
- GSNR ≪ 1: noisy gradients; each coordinate's update is mostly noise. Small
  GSNR is normal late in training; a model whose GSNR collapses early learns
  little from each step (increase the batch size or lower the learning rate).
- Liu et al. relate a larger GSNR during training to a smaller generalisation gap.
- A layer with a much smaller GSNR than the others is dominated by noise.
"""

from .. import data, style
from ._common import finish_time_axes, layer_lines, missing, no_finite, not_tracked, raw_and_smooth

TITLE = "Mean GSNR"
KEYS = ("MeanGSNR",)


def gauge(record, ax, *, layers=True, yscale="auto", **options):
    """Draw the mean gradient signal-to-noise ratio over steps on ``ax``."""
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    xs, ys = data.finite(*data.series(record, "MeanGSNR"))
    if len(xs) == 0:
        return no_finite(ax, TITLE, KEYS, record)
    shown = [ys]
    if layers:
        lx, matrix = data.layer_series(record, "MeanGSNR")
        if matrix.size and matrix.shape[1] > 1:
            layer_lines(ax, lx, matrix, linewidth=0.7, alpha=0.7)
            shown.append(matrix)
    raw_and_smooth(ax, xs, ys, style.TOTAL, label="mean GSNR")
    scale = style.auto_yscale(ax, *shown, scale=yscale)
    lo, hi = ax.get_ylim()
    if lo <= 1 <= hi or scale == "log":
        ax.axhline(1.0, color=style.REFERENCE, linestyle="--", linewidth=0.8, zorder=0)
    ax.set_ylim(lo, hi)
    finish_time_axes(ax, options, ylabel="GSNR")
    style.set_title(ax, f"mean GSNR {style.fmt(ys[-1])}" + (" (noise ≫ signal)" if ys[-1] < 0.1 else ""))
