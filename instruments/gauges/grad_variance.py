"""Gradient variance gauge: the spread of the individual gradients.

``GradVariance`` = tr Σ, the trace of the covariance of the per-sample gradients
g_n (Σ_d of the unbiased per-coordinate variance), summed over all parameters
(bold black) and per parameter tensor (thin coloured lines). For scale, ‖g‖² of the
mini-batch mean gradient is drawn dashed gray where ``GradNorm`` is tracked.

How to read it
- tr Σ / B is the variance of the mini-batch gradient (B = batch size); compare
  it with ‖g‖²: when tr Σ / B exceeds ‖g‖² the noise is larger than the signal
  (the norm test above 1 says the same).
- The variance usually falls more slowly than ‖g‖², so the ratio grows during
  training.
- A sudden jump in one layer: some samples produce outlying gradients there
  (bad data, a loss spike); look at the histograms.
- Estimated from a subsample of the batch (``Cockpit(samples=k)``): shaded with the
  95 % interval of the total (``_common.estimate_band``), "est." in the title.
"""

from .. import data, style
from ._common import estimate_band, largest_layer, layered, missing, no_finite, not_tracked

TITLE = "Gradient variance"
KEYS = ("GradVariance",)


def gauge(record, ax, *, layers=True, yscale="auto", reference=True, **options):
    """Draw tr Σ over steps (total bold, per layer thin) on ``ax``.

    Args:
        layers: draw one thin line per parameter tensor.
        yscale: ``"auto"``, ``"linear"`` or ``"log"``.
        reference: also draw ‖g‖² (from ``GradNorm``) dashed.
    """
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    gx, gy = data.finite(*data.series(record, "GradNorm")) if reference else ([], [])
    if reference and len(gx):
        ax.plot(gx, gy**2, color=style.REFERENCE, linestyle="--", linewidth=1.0, label="‖g‖²", zorder=1)
    xs, totals, matrix, names = layered(record, ax, "GradVariance", options, ylabel="tr Σ", layers=layers,
                                        yscale=yscale, label="tr Σ")
    if len(xs) == 0:
        return no_finite(ax, TITLE, KEYS, record)
    if reference and len(gx):
        style.auto_yscale(ax, totals, gy**2, *( [matrix] if layers and matrix.size else []), scale=yscale)
        style.legend(ax, loc="best", ncol=2)
    estimated = estimate_band(ax, record, "GradVariance")
    title = f"tr Σ {style.fmt(totals[-1])}"
    if reference and len(gx):
        title += f" · ‖g‖² {style.fmt(gy[-1] ** 2)}"
    elif matrix.size and matrix.shape[1] > 1:
        name, _ = largest_layer(matrix, names)
        if name is not None:
            title += f" · largest {name}"
    style.set_title(ax, title + estimated)
