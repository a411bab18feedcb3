"""Hessian trace gauge: the total curvature, per layer.

``HessTrace``: tr H, the sum of the diagonal of the curvature matrix (exact Hessian
diagonal by default, or the generalised Gauss-Newton), total in bold black and per
parameter tensor as thin coloured lines.

How to read it
- The trace is the summed curvature over all directions (λmax is the sharpest
  one); together they say whether the landscape is sharp in a few or in many
  directions.
- Rising trace: the optimiser moves into sharper regions (often early in
  training); large-trace minima are associated with worse generalisation.
- Negative values (exact Hessian only) mean negative curvature dominates: the
  model is in a saddle or concave region, typically early on.
- Per-layer lines localise where the curvature sits (often the last layers).
The axis switches to a log scale (symmetric log when values of both signs span
decades) when needed. Values estimated from Hessian-vector products (Hutchinson's
estimator, ``meta.curvature == "hutchinson"`` in the record) are estimates: the shaded
band is the 95 % t-interval of the total at the recorded degrees of freedom (clipped to the
values' span; ``_common.estimate_band``) and the title says "est." with the number of probe
vectors.
"""

from .. import style
from ._common import estimate_band, largest_layer, layered, missing, no_finite, not_tracked

TITLE = "Hessian trace"
KEYS = ("HessTrace",)


def gauge(record, ax, *, layers=True, yscale="auto", **options):
    """Draw tr H over steps (total bold, per layer thin) on ``ax``."""
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    xs, totals, matrix, names = layered(record, ax, "HessTrace", options, ylabel="tr H", layers=layers,
                                        yscale=yscale)
    if len(xs) == 0:
        return no_finite(ax, TITLE, KEYS, record)
    title = f"tr H {style.fmt(totals[-1])} @ {int(xs[-1])}"
    if matrix.size and matrix.shape[1] > 1:
        name, value = largest_layer(matrix, names)
        if name is not None:
            title += f" · largest {name}"
    title += estimate_band(ax, record, "HessTrace")
    style.set_title(ax, title)
