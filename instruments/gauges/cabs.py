"""CABS gauge: the batch size suggested by "Coupling Adaptive Batch Sizes".

``CABS`` = (learning rate) × tr Σ / loss (Balles, Romero & Hennig 2017): the batch
size that, under their assumptions for SGD, makes the best progress per sample.
Raw values as dots, moving average bold.

How to read it
- Compare it with the batch size actually used: a suggestion far above it says
  the gradient is too noisy for this learning rate (increase the batch or lower
  the learning rate); far below, samples are wasted on an over-precise gradient.
- The suggestion typically grows during training as the loss drops while the
  gradient noise does not.
"""

from .. import data, style
from ._common import finish_time_axes, missing, no_finite, not_tracked, raw_and_smooth

TITLE = "CABS batch size"
KEYS = ("CABS",)


def gauge(record, ax, *, yscale="auto", **options):
    """Draw the CABS batch-size suggestion over steps on ``ax``."""
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    xs, ys = data.finite(*data.series(record, "CABS"))
    if len(xs) == 0:
        return no_finite(ax, TITLE, KEYS, record)
    raw_and_smooth(ax, xs, ys, style.QUATERNARY, label="CABS")
    style.auto_yscale(ax, ys, scale=yscale)
    finish_time_axes(ax, options, ylabel="batch size")
    style.set_title(ax, f"CABS batch size {style.fmt(ys[-1])}")
