"""Dead units gauge: which ReLU layers stopped firing, and when.

A heat map, one row per ReLU-family module (in the order the modules ran), one
column per recorded step: the fraction of the module's units that did not fire on
any sample of the batch (``ActivationStats.dead``). White is healthy; dark red means
most units are dead and pass no gradient. The red mark on the colour bar is the
``dead_relu`` rule's threshold (50 %, sustained over 3 records).

How to read it
- A row that turns red after a few steps and stays red: the layer died, usually
  from a blown-up step (too large a learning rate) or a large negative bias.
- A row red from step 0: a bad initialisation or inputs on the wrong scale.
- Rows of digit images' border pixels are never quite white (always-zero inputs).
"""

from .. import style
from . import _heatmap, activations
from ._common import not_tracked

TITLE = "Dead units (ReLU)"
KEYS = (activations.KEY,)


def has_data(record):
    """Whether the record holds dead-unit fractions."""
    return activations.has(record, "dead")


def gauge(record, ax, **options):
    """Draw the dead fraction of every ReLU-family module over steps on ``ax``."""
    if not has_data(record):
        return not_tracked(ax, TITLE, KEYS)
    xs, matrix, labels = activations.matrix(record, "dead")
    _heatmap.draw(ax, xs, matrix, labels, vmin=0.0, vmax=1.0, cmap="Reds", label="dead fraction",
                  threshold=0.5, threshold_label="rule, 50%", options=options)
    name, value = _heatmap.worst(matrix, labels)
    title = "Dead units" + (f" · worst {style.percent(value)} in {name.split(' (')[0]}" if name else "")
    style.set_title(ax, title)
