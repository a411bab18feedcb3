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

from . import activations

TITLE = "Dead units (ReLU)"
KEYS = (activations.KEY,)


def has_data(record):
    """Whether the record holds dead-unit fractions."""
    return activations.has(record, "dead")


def gauge(record, ax, **options):
    """Draw the dead fraction of every ReLU-family module over steps on ``ax``."""
    return activations.draw_fraction(record, ax, "dead", TITLE, "Dead units", options)
