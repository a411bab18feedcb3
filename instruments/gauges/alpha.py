"""α gauge: where on the local parabola does each step land?

Shows the distribution of the ``Alpha`` quantity: at every tracked step a 1-d
quadratic is fitted (with noise) to the loss along the update direction, and α is
the position the step reached, normalised so that the start is at α = −1, the
parabola's minimum (the valley floor) at α = 0 and the mirror point on the far
side at α = 1. One y axis, the fraction of steps: the gray histogram holds all
tracked steps, the blue one the last 10 % (``last_fraction``); the orange unit
parabola sketches the loss along the step (drawn to the height of the bars, it has
no scale of its own); the title gives the median of the recent ones.

How to read it
- α ≈ 0: each step lands near the minimum of the local quadratic.
- α slightly above 0 (0 … 1) is typical of well-tuned SGD: it overshoots the
  valley floor a bit (the paper argues that this is desirable, not a bug).
- α > 1: the step jumps beyond the mirror point; the loss along the step rises,
  the learning rate is probably too large.
- α < 0 (towards −1): the steps stop short; the learning rate may be too small.
  Exactly −1 is recorded when the fit is concave (no valley along the step); a
  histogram piled up at −1 means concave fits (or undershooting), the title counts
  them.
Values outside ±``clip`` (default 2.5) are counted in the outermost bins (so a few
outliers cannot squash the histogram), and the legend says how many there are.
"""

import math

import numpy as np
from matplotlib.lines import Line2D

from .. import data, style
from ._common import missing, no_finite, not_tracked

TITLE = "α (local step length)"
KEYS = ("Alpha",)


def gauge(record, ax, *, last_fraction=0.1, clip=2.5, bins=None, **options):
    """Draw the α distribution on ``ax``.

    Args:
        record: the record.
        ax: matplotlib Axes.
        last_fraction: fraction of the most recent α values shown in blue.
        clip: α beyond ±clip is counted in the edge bins.
        bins: bin edges (default: width 0.1 over ±clip).
    """
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    xs, values = data.finite(*data.series(record, "Alpha"))
    if len(values) == 0:
        return no_finite(ax, TITLE, KEYS, record)

    n_last = max(1, int(math.ceil(len(values) * last_fraction)))
    recent = values[-n_last:]
    if bins is None:
        bins = np.linspace(-clip, clip, int(round(2 * clip / 0.1)) + 1)

    pct = int(round(100 * last_fraction))
    clipped, clipped_recent = np.clip(values, -clip, clip), np.clip(recent, -clip, clip)
    weights_all = np.full(len(values), 1.0 / len(values))
    weights_recent = np.full(len(recent), 1.0 / len(recent))
    ax.hist(clipped, bins=bins, weights=weights_all, color=style.ALL_COLOR, alpha=0.45,
            label=f"all (n={len(values)})")
    ax.hist(clipped_recent, bins=bins, weights=weights_recent, color=style.PRIMARY, alpha=0.6,
            label=f"last {pct}% (n={len(recent)})")
    top = 1.5 * max(np.histogram(clipped, bins, weights=weights_all)[0].max(),
                     np.histogram(clipped_recent, bins, weights=weights_recent)[0].max())
    # one y axis, the fraction of steps; the unit parabola (the loss along the step, 1 at the start
    # α = -1, 0 at the minimum) is a sketch drawn to the height of the bars, not a second scale
    grid = np.linspace(-clip, clip, 200)
    ax.plot(grid, top / 1.75 * grid**2, color=style.SECONDARY, linewidth=1.5, zorder=3,
            label="loss along the step (sketch)")
    for x in (-1, 0, 1):
        ax.axvline(x, color="#bbbbbb", linewidth=0.8, zorder=0)
    ax.set_ylim(0, top)
    ax.set_xlim(-clip, clip)
    style.style_axes(ax, xlabel="α   (−1 start · 0 valley floor · 1 mirror point)", ylabel="fraction of steps",
                     grid=False)

    handles, labels = ax.get_legend_handles_labels()
    below, above = int((values < -clip).sum()), int((values > clip).sum())
    outside = ([f"{below} < −{clip:g}"] if below else []) + ([f"{above} > {clip:g}"] if above else [])
    if outside:  # counted in the edge bins: the legend says how many
        handles.append(Line2D([], [], linestyle="none"))
        labels.append(", ".join(outside) + ", in the edge bins")
    legend = ax.legend(handles, labels, loc="upper left", ncol=2, fontsize=style.LEGEND_SIZE, framealpha=0.9,
                       borderpad=0.3, handlelength=1.2, labelspacing=0.2, columnspacing=0.8)
    legend.set_in_layout(False)  # inside the panel: a narrow one must not give up the layout for it

    title = f"α, last {pct}%: median {float(np.median(recent)):.2f}"
    concave = float(np.mean(values == -1.0))
    if concave >= 0.05:
        title += f" · {concave:.0%} at −1"
    style.set_title(ax, title)
