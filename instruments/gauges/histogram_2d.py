"""2-d histogram gauge: individual gradient elements against parameter values.

Joint histogram (log colour: darker = more elements, white = none) of the pairs
(θ_d, g_{n,d}) over all per-sample gradients of the mini-batch at the last tracked
step: x = parameter value, y = gradient element. The marginals are drawn above
(parameter values) and to the right (gradient elements), on log count axes. By
default the view is zoomed to the occupied bins (``zoom=False`` shows the whole
recorded range). ``layer=i`` draws one parameter tensor (if the record holds
per-layer 2-d histograms); ``layerwise_grid`` draws all of them.

How to read it
- A horizontal band: gradients are small for all weights, the usual picture.
- Gradient spread growing with |θ| (a funnel or a slanted band): large weights
  get large gradients, e.g. a sign of missing normalisation or weight decay.
- Mass at the edges of the recorded range is clipped (counted in the edge bins);
  the title reports the clipped fraction.
- Parameters piling up at a few values (tall narrow spikes in the top marginal)
  are dead or untrained (e.g. biases still at their initial value).
"""

import numpy as np
from matplotlib import colormaps, ticker
from matplotlib.colors import ListedColormap, LogNorm

from .. import data, style
from ._common import missing, not_tracked, layer_names

TITLE = "Gradient × parameter histogram"
KEYS = ("GradHist2d",)
CMAP = ListedColormap(colormaps["Blues"](np.linspace(0.25, 1.0, 256)), name="counts")


def _occupied(counts, edges, pad=1):
    nonzero = np.flatnonzero(counts > 0)
    if nonzero.size == 0:
        return edges[0], edges[-1]
    lo = max(nonzero[0] - pad, 0)
    hi = min(nonzero[-1] + 1 + pad, len(edges) - 1)
    return edges[lo], edges[hi]


def gauge(record, ax, *, step=None, layer=None, marginals=True, zoom=True, short_title=False, **options):
    """Draw the 2-d (parameter, gradient) histogram on ``ax``.

    With ``marginals`` the panel ``ax`` becomes a frame (title only) holding three
    inset axes: joint, top marginal, right marginal.

    Args:
        step: which step (default: the last one that has the histogram).
        layer: draw this parameter tensor's histogram only.
        marginals: add the marginal histograms.
        zoom: limit both axes to the occupied bins.
        short_title: title with the layer name only (for grids of small panels).
    """
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    at, hist = data.histogram(record, "GradHist2d", step=step, layer=layer)
    names = layer_names(record, options)
    if hist is None:
        style.set_title(ax, TITLE)
        what = f"layer {layer}" if layer is not None else f"step {step}"
        return style.note(ax, f"no 2-d histogram for {what}")
    counts = np.asarray(hist["hist"], dtype=float)  # [gradient bins, parameter bins]
    grad_edges = np.asarray(hist["edges"][0], dtype=float)
    param_edges = np.asarray(hist["edges"][1], dtype=float)

    if marginals:
        ax.set_axis_off()
        joint = ax.inset_axes([0.0, 0.0, 0.8, 0.76])
        top = ax.inset_axes([0.0, 0.79, 0.8, 0.21], sharex=joint)
        right = ax.inset_axes([0.82, 0.0, 0.18, 0.76], sharey=joint)
    else:
        joint, top, right = ax, None, None

    positive = counts[counts > 0]
    vmax = positive.max() if positive.size else 1.0
    masked = np.ma.masked_less_equal(counts, 0)
    joint.pcolormesh(param_edges, grad_edges, masked, cmap=CMAP, norm=LogNorm(vmin=1, vmax=max(vmax, 1.5)),
                     rasterized=True)
    joint.axhline(0, color=style.REFERENCE, linewidth=0.5, linestyle="--")
    joint.axvline(0, color=style.REFERENCE, linewidth=0.5, linestyle="--")
    style.style_axes(joint, xlabel="parameter value", ylabel="gradient element", grid=False)
    for side in ("top", "right"):
        joint.spines[side].set_visible(True)
    if zoom:
        joint.set_xlim(*_occupied(counts.sum(axis=0), param_edges))
        joint.set_ylim(*_occupied(counts.sum(axis=1), grad_edges))
    else:
        joint.set_xlim(param_edges[0], param_edges[-1])
        joint.set_ylim(grad_edges[0], grad_edges[-1])
    joint.xaxis.set_major_locator(ticker.MaxNLocator(nbins=5, symmetric=True))
    joint.yaxis.set_major_locator(ticker.MaxNLocator(nbins=5, symmetric=True))

    if marginals:
        top.stairs(counts.sum(axis=0), param_edges, fill=True, color=style.PRIMARY, alpha=0.8, baseline=0.8)
        right.stairs(counts.sum(axis=1), grad_edges, fill=True, color=style.PRIMARY, alpha=0.8,
                     orientation="horizontal", baseline=0.8)
        top.set_yscale("log")
        right.set_xscale("log")
        top.yaxis.set_major_locator(ticker.NullLocator())
        top.yaxis.set_minor_locator(ticker.NullLocator())
        right.xaxis.set_major_locator(ticker.NullLocator())
        right.xaxis.set_minor_locator(ticker.NullLocator())
        for marginal in (top, right):
            marginal.tick_params(labelbottom=False, labelleft=False, bottom=False, left=False,
                                 which="both")
            for spine in marginal.spines.values():
                spine.set_visible(False)
            marginal.set_facecolor("none")
        top.set_ylim(bottom=0.8)
        right.set_xlim(left=0.8)

    n = counts.sum()
    clipped = int(hist.get("clipped", 0) or 0)
    where = "all layers" if layer is None else style.short_name(names[layer] if layer < len(names) else layer, 16)
    title = where if short_title else f"grad × param @ {at} ({where})"
    if clipped and n:
        title += f" · {style.percent(clipped / n)} clipped"
    style.set_title(ax, title)


def layerwise_grid(record, fig, subplotspec=None, ncols=None, **options):
    """Draw one 2-d histogram per parameter tensor into ``fig`` (a Figure or SubFigure).

    Uses ``subplotspec`` (a ``SubplotSpec``) as the area when given, else the whole
    ``fig``. Falls back to per-layer 1-d histograms when the record has no per-layer
    2-d histograms. Returns the list of Axes drawn on.
    """
    from . import histogram_1d

    at, _ = data.histogram(record, "GradHist2d", layer=0)
    kind, draw = ("GradHist2d", gauge) if at is not None else ("GradHist1d", histogram_1d.gauge)
    if kind == "GradHist1d":
        at, _ = data.histogram(record, "GradHist1d", layer=0)
    per_layer = record[at].get(data.log.LAYERS, {}).get(kind, []) if at is not None else []
    n = len(per_layer)
    if n == 0:
        ax = fig.add_subplot(subplotspec) if subplotspec is not None else fig.add_subplot()
        style.set_title(ax, "Per-layer histograms")
        style.note(ax, "not tracked\nno per-layer histograms in the record\n(track GradHist1d/GradHist2d per layer)")
        return [ax]
    ncols = ncols or min(n, 6)
    nrows = int(np.ceil(n / ncols))
    grid = (subplotspec.subgridspec(nrows, ncols) if subplotspec is not None
            else fig.add_gridspec(nrows, ncols))
    axes = []
    for i in range(n):
        ax = fig.add_subplot(grid[i // ncols, i % ncols])
        draw(record, ax, step=at, layer=i, short_title=True, **options)
        axes.append(ax)
    what = "gradient × parameter" if kind == "GradHist2d" else "gradient element"
    if hasattr(fig, "suptitle"):
        fig.suptitle(f"LAYERWISE: {what} histogram per parameter tensor @ step {at}", fontsize=10,
                     fontweight="bold")
    return axes
