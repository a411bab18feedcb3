"""Gradient-to-weight ratio gauge: ‖g‖/‖θ‖ of every parameter tensor over steps.

A heat map, one row per parameter tensor (in ``model.named_parameters()`` order),
one column per recorded step, on a log colour scale; black: exactly 0 (no gradient
reaches the tensor). Read from ``GradNorm`` and ``ParamNorm`` (both recorded by the
default diagnosis).

How to read it
- Healthy nets keep the rows within a few orders of magnitude of each other.
- Rows near the input far darker than those near the output: vanishing gradients
  (the ``vanishing_gradients`` rule compares first to last); far brighter:
  exploding gradients.
- A row that turns black: the tensor stopped getting a gradient (dead units in
  front of it, a detached branch).
"""

from .. import style
from . import _heatmap, ratios
from ._common import not_tracked

TITLE = "‖g‖/‖θ‖ per layer"
KEYS = ("GradNorm", ratios.NORM)


def has_data(record):
    """Whether the record holds gradient and parameter norms at a common step."""
    return ratios.has(record, "GradNorm")


def gauge(record, ax, **options):
    """Draw ‖g‖/‖θ‖ of every parameter tensor over steps on ``ax``."""
    if not has_data(record):
        return not_tracked(ax, TITLE, KEYS)
    xs, matrix, names = ratios.matrix(record, "GradNorm", options)
    _heatmap.draw(ax, xs, matrix, names, log=True, cmap="viridis", label="‖g‖/‖θ‖",
                  zero_label="no gradient", options=options)
    name, value = _heatmap.worst(matrix, names, largest=False)
    style.set_title(ax, "‖g‖/‖θ‖" + (f" · smallest {style.fmt(value)} in {name}" if name else ""))
