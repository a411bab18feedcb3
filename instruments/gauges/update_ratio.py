"""Update-to-weight ratio gauge: ‖Δθ‖/‖θ‖ of every parameter tensor over steps.

A heat map, one row per parameter tensor, one column per recorded step, on a log
colour scale; black: exactly 0 (the tensor did not move). Read from ``UpdateSize``
(the step's update, known one step later) and ``ParamNorm``. The red mark on the
colour bar is Karpathy's rule of thumb, about 1e-3 per step for a healthy learning
rate.

How to read it
- Rows far above 1e-3 (≥ 0.5 with a loss that does not fall: the ``lr_too_high``
  rule): the learning rate is too large for that layer.
- Rows far below (< 3e-4 with a flat loss: ``lr_too_low``): too small.
- One row much brighter than the rest: that layer dominates the update (e.g. a bias
  or a normalisation scale under Adam).
"""

from .. import style
from . import _heatmap, ratios
from ._common import not_tracked

TITLE = "‖Δθ‖/‖θ‖ per layer"
KEYS = ("UpdateSize", ratios.NORM)
HEALTHY = 1e-3


def has_data(record):
    """Whether the record holds update sizes and parameter norms at a common step."""
    return ratios.has(record, "UpdateSize")


def gauge(record, ax, **options):
    """Draw ‖Δθ‖/‖θ‖ of every parameter tensor over steps on ``ax``."""
    if not has_data(record):
        return not_tracked(ax, TITLE, KEYS)
    xs, matrix, names = ratios.matrix(record, "UpdateSize", options)
    _heatmap.draw(ax, xs, matrix, names, log=True, cmap="viridis", label="‖Δθ‖/‖θ‖", threshold=HEALTHY,
                  threshold_label="1e-3, healthy", zero_label="did not move", options=options)
    name, value = _heatmap.worst(matrix, names)
    style.set_title(ax, "‖Δθ‖/‖θ‖" + (f" · largest {style.fmt(value)} in {name}" if name else ""))
