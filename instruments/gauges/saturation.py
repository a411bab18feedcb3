"""Saturation gauge: which tanh/sigmoid layers sit in their flat tails, and when.

A heat map, one row per tanh- or sigmoid-family module, one column per recorded
step: the fraction of outputs in the flat tails, where the derivative is below 2 %
of its peak (``ActivationStats.saturated``). White is healthy; dark red means the
layer passes almost no gradient. The red mark on the colour bar is the
``saturated_activations`` rule's threshold (50 %, sustained).

How to read it
- Red from step 0: the initialisation is too large for tanh/sigmoid, or the inputs
  are not normalised.
- Turning red during training: a too large learning rate drives pre-activations out.
"""

from . import activations

TITLE = "Saturated activations"
KEYS = (activations.KEY,)


def has_data(record):
    """Whether the record holds saturation fractions (only tanh/sigmoid modules have them)."""
    return activations.has(record, "saturated")


def gauge(record, ax, **options):
    """Draw the saturated fraction of every tanh/sigmoid module over steps on ``ax``."""
    return activations.draw_fraction(record, ax, "saturated", TITLE, "Saturation", options)
