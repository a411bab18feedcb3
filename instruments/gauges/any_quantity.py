"""A panel for any scalar quantity the fixed gauges do not know (custom quantities).

``Dashboard(extra=["MyQuantity"])`` (or ``CockpitPlotter(extra=[...])``) adds a row
with one such panel per key: the bold line is the whole-network value, thin coloured
lines the per-layer values (``record[step]["layers"][key]``), a per-parameter list
is drawn per layer with its sum as the total.
"""

from .. import data, style
from ._common import layered, missing, no_finite, not_tracked


def gauge(record, ax, key, **options):
    """Draw quantity ``key`` over steps on ``ax``."""
    if missing(record)(key):
        return not_tracked(ax, key, (key,))
    xs, totals, _, _ = layered(record, ax, key, options, ylabel=key)
    if len(xs) == 0:
        return no_finite(ax, key, (key,), record)
    style.set_title(ax, f"{key} {style.fmt(totals[-1])} @ {int(xs[-1])}")
