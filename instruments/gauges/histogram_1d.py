"""1-d gradient histogram gauge: the distribution of individual gradient elements.

Histogram (log counts) of every element of every per-sample gradient g_{n,d} in the
mini-batch at the last tracked step (or ``step=``). The record's histogram has a
fixed range (default (−2, 2)); values outside it are counted in the outermost bins,
which are drawn red when that happened, and the title gives the clipped fraction.
With ``layers=True`` the per-layer histograms (where recorded) are overlaid as
normalised coloured outlines, with ``layer=i`` only layer ``i`` is drawn.

How to read it
- A narrow, symmetric peak at 0 with tails falling off smoothly is normal.
- Heavy tails or a large clipped fraction: some samples produce huge gradients
  (outliers, exploding gradients, a too-large learning rate upstream);
  the per-layer view shows which tensor they come from.
- Everything in the central bin: gradients are vanishing (or the range is far
  too wide for this model; change the quantity's range).
- Asymmetry means a consistent push in one direction.
- "est. k/B samples" in the title: the counts of a subsample of the batch's samples
  (``Cockpit(samples=k)``), scaled by B/k.
The title's σ is the standard deviation estimated from the bin centres.
"""

import numpy as np
from matplotlib import ticker

from .. import data, style
from ._common import missing, not_tracked, layer_names

TITLE = "Gradient element histogram"
KEYS = ("GradHist1d",)


def _stats(hist, edges):
    centres = 0.5 * (edges[1:] + edges[:-1])
    count = hist.sum()
    if count <= 0:
        return 0, float("nan")
    mean = float((hist * centres).sum() / count)
    std = float(np.sqrt(max((hist * (centres - mean) ** 2).sum() / count, 0.0)))
    return int(count), std


def gauge(record, ax, *, step=None, layer=None, layers=False, short_title=False, **options):
    """Draw the 1-d histogram of per-sample gradient elements on ``ax``.

    Args:
        step: which step (default: the last one that has the histogram).
        layer: draw the histogram of this parameter tensor only.
        layers: overlay all per-layer histograms (normalised) on the total.
        short_title: title with the layer name only (for grids of small panels).
    """
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    at, hist = data.histogram(record, "GradHist1d", step=step, layer=layer)
    if hist is None:
        what = f"layer {layer}" if layer is not None else f"step {step}"
        style.set_title(ax, TITLE)
        return style.note(ax, f"no 1-d histogram for {what}")
    counts = np.asarray(hist["hist"], dtype=float)
    edges = np.asarray(hist["edges"], dtype=float)
    widths = np.diff(edges)
    names = layer_names(record, options)

    per_layer = []
    if layers and layer is None:
        entry = record[at].get(data.log.LAYERS, {}).get("GradHist1d") or []
        per_layer = [h for h in entry if isinstance(h, dict) and "hist" in h]

    if per_layer:
        total = counts.sum() or 1.0
        ax.bar(edges[:-1], counts / total, width=widths, align="edge", color=style.ALL_COLOR, alpha=0.45,
               linewidth=0, label="all")
        colors = style.layer_colors(len(per_layer))
        for j, h in enumerate(per_layer):
            c = np.asarray(h["hist"], dtype=float)
            if c.sum() > 0:
                ax.stairs(c / c.sum(), np.asarray(h["edges"], dtype=float), color=colors[j], linewidth=0.9,
                          label=style.short_name(names[j], 14) if len(per_layer) <= 6 else None)
        ax.set_yscale("log")
        ylabel = "fraction"
    else:
        colors = [style.PRIMARY] * len(counts)
        clipped = int(hist.get("clipped", 0) or 0)
        if clipped:
            colors[0] = colors[-1] = style.FLAG
        ax.bar(edges[:-1], counts, width=widths, align="edge", color=colors, linewidth=0)
        ax.set_yscale("log")
        ylabel = "count"
    positive = counts[counts > 0]
    if per_layer:
        ax.set_ylim(bottom=0.5 / max(counts.sum(), 1))
    elif positive.size:
        ax.set_ylim(0.7, positive.max() * 2.5)
    ax.set_xlim(edges[0], edges[-1])
    style.style_axes(ax, xlabel="gradient element value", ylabel=ylabel)
    style.log_ticks(ax.yaxis)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=8, symmetric=True))
    if per_layer and len(per_layer) <= 6:
        style.legend(ax, loc="upper right")

    n, std = _stats(counts, edges)
    clipped = int(hist.get("clipped", 0) or 0)
    nonfinite = int(hist.get("nonfinite", 0) or 0)
    where = "" if layer is None else f" {style.short_name(names[layer], 14) if layer < len(names) else layer}"
    title = f"{where.strip() or 'all layers'}: σ≈{style.fmt(std, 2)}" if short_title else \
        f"grad elements{where} @ {at}: σ≈{style.fmt(std, 2)}"
    if n:
        title += f" · {style.percent(clipped / n)} clipped" if clipped else ""
    if nonfinite:
        title += f" · {nonfinite} non-finite"
    drawn = record[at].get(data.log.META, {}).get("GradHist1d") or {}
    if drawn.get("samples") is not None and not short_title:  # counts of a subsample, scaled to the batch
        title += f" · est. {drawn['samples']}/{drawn['of']} samples"
    style.set_title(ax, title)
    if nonfinite:
        ax.title.set_color(style.FLAG)
