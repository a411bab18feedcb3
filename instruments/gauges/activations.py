"""Activation health: per activation module, over steps (shared by ``dead_units`` and ``saturation``).

Reads ``ActivationStats`` (recorded by ``Cockpit(model)``'s diagnosis: forward hooks
on every activation module), ``{module: {"type", "mean", "std", "zeros", "dead",
"saturated"}}`` per recorded step.
"""

import numpy as np

from .. import data, style
from . import _heatmap
from ._common import not_tracked

KEY = "ActivationStats"


def matrix(record, field):
    """``(steps, matrix [modules, steps], labels)`` of one field; modules that never have it are left out."""
    steps = [s for s in sorted(record) if isinstance(record[s].get(KEY), dict)]
    modules, types = [], {}
    for s in steps:
        for name, values in record[s][KEY].items():
            if isinstance(values, dict) and values.get(field) is not None and name not in types:
                modules.append(name)
                types[name] = values.get("type") or "?"
    out = np.full((len(modules), len(steps)), np.nan)
    for j, s in enumerate(steps):
        entry = record[s][KEY]
        for i, name in enumerate(modules):
            values = entry.get(name)
            if isinstance(values, dict):
                out[i, j] = data.to_float(values.get(field))
    labels = [f"{name} ({types[name]})" for name in modules]
    return np.asarray(steps, dtype=float), out, labels


def has(record, field):
    """Whether any recorded module has ``field`` (e.g. ``saturated``: only tanh/sigmoid modules do)."""
    for entry in record.values():
        stats = entry.get(KEY)
        if isinstance(stats, dict) and any(isinstance(v, dict) and v.get(field) is not None for v in stats.values()):
            return True
    return False


def draw_fraction(record, ax, field, title, short, options):
    """The heat map of one fraction (``dead`` or ``saturated``) per module over steps, with
    the rules' 50 % threshold on the colour bar and the worst module in the title."""
    if not has(record, field):
        return not_tracked(ax, title, (KEY,))
    xs, values, labels = matrix(record, field)
    _heatmap.draw(ax, xs, values, labels, vmin=0.0, vmax=1.0, cmap="Reds", label=f"{field} fraction",
                  threshold=0.5, threshold_label="rule, 50%", options=options)
    name, value = _heatmap.worst(values, labels)
    style.set_title(ax, short + (f" · worst {style.percent(value)} in {name.split(' (')[0]}" if name else ""))
    return None
