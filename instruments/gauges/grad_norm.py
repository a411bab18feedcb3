"""Gradient norm gauge: how large is the mini-batch gradient, and where?

Bold black: ‖g‖, the L2 norm of the mini-batch gradient over all parameters
(root-sum-of-squares of the per-tensor norms). Thin coloured lines: ‖g‖ of each
parameter tensor (layer). The title gives the last total and the layer with the
largest gradient.

How to read it
- In healthy training the norm drops early and then stays roughly level or rises
  slowly (as the noise floor of SGD is reached).
- Spikes, or a steady climb, signal instability (too large a learning rate,
  exploding gradients); a layer whose line sits orders of magnitude above the
  others is where to look.
- A layer near zero receives (almost) no gradient: vanishing gradients, dead ReLUs
  or a disconnected parameter.
The axis switches to a log scale when the values span more than a factor of 30.
"""

from .. import style
from ._common import largest_layer, layered, missing, no_finite, not_tracked

TITLE = "Gradient norm"
KEYS = ("GradNorm",)


def gauge(record, ax, *, layers=True, yscale="auto", **options):
    """Draw ‖g‖ over steps (total bold, per layer thin) on ``ax``.

    Args:
        layers: draw one thin line per parameter tensor.
        yscale: ``"auto"``, ``"linear"`` or ``"log"``.
    """
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    xs, totals, matrix, names = layered(record, ax, "GradNorm", options, ylabel="‖g‖", layers=layers, yscale=yscale)
    if len(xs) == 0:
        return no_finite(ax, TITLE, KEYS, record)
    title = f"‖g‖ {style.fmt(totals[-1])}"
    if matrix.size and matrix.shape[1] > 1:
        name, value = largest_layer(matrix, names)
        if name is not None:
            title += f" · largest {name} ({style.fmt(value)})"
    style.set_title(ax, title)
