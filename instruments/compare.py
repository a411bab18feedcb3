"""Comparison view: several runs side by side (e.g. a learning-rate sweep).

Layout: an optional overlay panel on top with the smoothed mini-batch loss of every
run in its own colour (the quickest way to rank the runs), then one column per
run, one row per gauge (default: α distribution and performance). Within a row
all panels share the y range (and scale), and all columns share the step range,
so differences between runs are differences in the data, not in the axes.

    from instruments import compare
    compare(["lr_0.01.jsonl", "lr_0.1.jsonl", "lr_1.jsonl"], labels=["η=0.01", "η=0.1", "η=1"],
            savepath="cmp.png")

From the command line: ``python -m instruments a.jsonl b.jsonl --compare -o cmp.png``.
"""

import math
import warnings

import numpy as np
from matplotlib.figure import Figure

from . import data, style
from .gauges import GAUGES
from .gauges._common import draw_error

#: Default rows of the comparison.
ROWS = ("alpha", "performance")
#: Options that suit narrow comparison panels.
ROW_OPTIONS = {"performance": {"compact": True, "outside_legend": False, "accuracy": False}}


def _siblings(ax):
    """Axes that share ``ax``'s x axis (its twins), excluding ``ax``."""
    return [a for a in ax.get_shared_x_axes().get_siblings(ax) if a is not ax and a.figure is ax.figure]


def _unify(axes):
    """Give the axes of one row one y scale and the union of their y ranges.

    Where the gauges chose different scales for different runs (one run's values span
    decades, another's do not), the row becomes logarithmic when that is possible.
    """
    axes = [a for a in axes if a.has_data() or a.lines or a.patches]
    if len(axes) < 2:
        return
    scales = {a.get_yscale() for a in axes}
    limits = np.array([sorted(a.get_ylim()) for a in axes], dtype=float)
    inverted = [a.get_ylim()[0] > a.get_ylim()[1] for a in axes]
    if len(scales) > 1:
        if scales - {"log", "linear"}:
            return
        logs = np.array([a.get_yscale() == "log" for a in axes])
        lo = limits[logs, 0].min()
        hi = limits[:, 1].max()
        if not (lo > 0 and hi > lo):
            return
        for a in axes:
            if a.get_yscale() != "log":
                style.auto_yscale(a, scale="log")
    else:
        lo, hi = limits[:, 0].min(), limits[:, 1].max()
    if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
        for a, inv in zip(axes, inverted):
            a.set_ylim((hi, lo) if inv else (lo, hi))


def _overlay(ax, runs, labels, colors, options):
    best = None
    values = []
    for run, label, color in zip(runs, labels, colors):
        xs, ys = data.finite(*data.series(run.record, "Loss"))
        if len(xs) == 0:
            continue
        ax.plot(xs, ys, color=color, alpha=0.18, linewidth=0.7)
        current = data.recent(ys)
        ax.plot(xs, data.smooth(ys), color=color, linewidth=1.8, label=f"{label}: {style.fmt(current)}")
        values.append(ys)
        if best is None or current < best[1]:
            best = (label, current)
        flagged = data.flagged_steps(run.record)
        if flagged:
            style.mark_steps(ax, flagged, color=color)
    if not values:
        style.set_title(ax, "mini-batch loss")
        style.note(ax, "not tracked\nLoss missing from every run")
        return
    style.auto_yscale(ax, *values)
    style.style_axes(ax, ylabel="loss")
    style.step_axis(ax, options.get("log_steps", False))
    first, last = options["step_range"]
    ax.set_xlim(first - 0.01 * (last - first), last + 0.01 * (last - first) + 0.5)
    style.legend(ax, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    style.set_title(ax, f"mini-batch loss, smoothed (thin: raw) · lowest recent median: {best[0]} "
                        f"({style.fmt(best[1])})")


def compare(sources, labels=None, rows=ROWS, overlay=True, figsize=None, dpi=100, title=None, savepath=None,
            options=None, log_steps=False, strict=False):
    """Draw several runs side by side and optionally save the figure.

    Args:
        sources: runs, each anything ``instruments.data.load`` accepts.
        labels: one label per run (default: the log file names, else "run i").
        rows: gauge names, one row each (see ``instruments.GAUGES``).
        overlay: add the overlaid loss panel on top.
        figsize: inches (default: 3.6 per run wide, min 9; 2.6 per row high + overlay).
        dpi: resolution of the saved file.
        title: figure title.
        savepath: if given, save the figure there (PNG unless the extension says otherwise).
        options: ``{gauge name: {option: value}}``, merged over ``ROW_OPTIONS``.
        log_steps: symlog step axes.
        strict: re-raise gauge errors.

    Returns:
        The matplotlib ``Figure``.
    """
    sources = list(sources)
    if not sources:
        raise ValueError("compare() needs at least one run")
    runs = [data.load(s) for s in sources]
    if labels is None:
        labels = [run.name if run.path else f"run {i}" for i, run in enumerate(runs)]
    labels = [str(label) for label in labels]
    if len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
    rows = list(rows)
    unknown = [r for r in rows if r not in GAUGES]
    if unknown:
        raise KeyError(f"unknown gauge(s) {unknown}; known: {', '.join(GAUGES)}")
    n = len(runs)
    if figsize is None:
        figsize = (max(9.0, 3.6 * n), 2.6 * len(rows) + (2.4 if overlay else 0) + 0.6)
    colors = style.layer_colors(max(n, 2))[:n] if n <= 10 else style.layer_colors(n)

    firsts, lasts = zip(*(data.step_range(run.record) for run in runs))
    common = {"log_steps": log_steps, "step_range": (min(firsts), max(lasts))}
    merged = {name: dict(ROW_OPTIONS.get(name, {})) for name in GAUGES}
    for name, opts in (options or {}).items():
        merged.setdefault(name, {}).update(opts)

    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    fig.get_layout_engine().set(w_pad=0.04, h_pad=0.04, wspace=0.02, hspace=0.02)
    if overlay:
        top, bottom = fig.subfigures(2, 1, height_ratios=[2.4, 2.6 * len(rows)], hspace=0.01)
        _overlay(top.subplots(), runs, labels, colors, common)
    else:
        bottom = fig
    columns = bottom.subfigures(1, n, wspace=0.01) if n > 1 else [bottom.subfigures(1, 1)]
    grid = []
    for run, label, color, column in zip(runs, labels, colors, np.atleast_1d(columns)):
        column.suptitle(label, fontsize=11, fontweight="bold", color=color)
        axes = np.atleast_1d(column.subplots(len(rows), 1))
        names = run.layer_names(data.n_layers(run.record))
        for name, ax in zip(rows, axes):
            try:
                GAUGES[name].draw(run.record, ax, params=names, **common, **merged.get(name, {}))
            except Exception as error:
                if strict:
                    raise
                warnings.warn(f"instruments: gauge {name!r} failed for {label}: {error!r}", RuntimeWarning,
                              stacklevel=2)
                draw_error(ax, GAUGES[name].title, error)
        grid.append(axes)
    for r in range(len(rows)):
        row = [axes[r] for axes in grid]
        _unify(row)
        twins = [t for ax in row for t in _siblings(ax)[:1]]
        if len(twins) == len(row):
            _unify(twins)
    fig.suptitle(title or f"comparison of {n} run{'s' if n > 1 else ''}", fontsize=12, fontweight="bold")
    if savepath is not None:  # a temporary file, renamed: never a half-written picture
        data.atomic_save(lambda temporary: fig.savefig(temporary, dpi=dpi), savepath)
    return fig
