"""Hyperparameter gauge: the learning rate over training.

``learning_rate`` as logged by ``Cockpit.log(learning_rate=...)`` (a step line:
the value holds until the next log). Log scale when it spans more than a factor of
30 (e.g. decays by several orders of magnitude).

How to read it
- Lines up schedule events (warm-up, decays, restarts) with what the other gauges
  show: e.g. α and the update size should shrink after a decay, the loss drop.
"""

import numpy as np

from .. import data, style
from ._common import finish_time_axes, label_points, marker_style, missing, no_finite, not_tracked

TITLE = "Hyperparameters"
KEYS = ("learning_rate",)


def gauge(record, ax, *, yscale="auto", **options):
    """Draw the logged learning rate over steps on ``ax``."""
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    xs, ys = data.finite(*data.series(record, "learning_rate"))
    if len(xs) == 0:
        return no_finite(ax, TITLE, KEYS, record)
    last_step = max(data.step_range(record)[1], xs[-1])
    ax.step(np.append(xs, last_step), np.append(ys, ys[-1]), where="post", color=style.SECONDARY,
            linewidth=1.8, label="learning rate")
    ax.plot(xs, ys, linestyle="none", marker="o", color=style.SECONDARY, **marker_style(len(xs), 3))
    scale = style.auto_yscale(ax, ys, scale=yscale)
    if scale == "linear":
        ax.set_ylim(0, ys.max() * 1.2 if ys.max() > 0 else 1)
    finish_time_axes(ax, options, ylabel="learning rate")
    if len(xs) == 1:  # one value logged so far: say it where it is drawn
        label_points(ax, [(ax, xs[0], ys[0], style.fmt(ys[0]), style.SECONDARY)])
    style.set_title(ax, f"learning rate {style.fmt(ys[-1])}")
