"""Colours, font sizes and the small drawing helpers every gauge shares.

Nothing here touches matplotlib's global state (``rcParams``, pyplot): sizes are
passed to each artist, so that rendering from a background thread cannot change how
anything else in the process draws.

Conventions used by all gauges
------------------------------
- bold black line: the total over all parameter tensors;
- thin coloured lines: one per layer (parameter tensor), coloured by ``layer_colors``
  in parameter order (the dashboard adds one legend for all panels);
- light dots or a thin line: raw values; a bold line of the same colour: the same
  values smoothed (``instruments.data.smooth``: a centred moving average);
- red ticks on the step axis: steps flagged in the record (e.g. a non-finite loss).
"""

import math

import numpy as np
from matplotlib import colormaps, ticker

PRIMARY = "#3b6db3"  # blue
SECONDARY = "#e8772e"  # orange
TERTIARY = "#2e9a5a"  # green
QUATERNARY = "#8e5bb5"  # violet
TOTAL = "black"
ALL_COLOR = "#9a9a9a"  # gray: "everything", as opposed to "recent"
FLAG = "#d62728"  # red: something went wrong at this step
REFERENCE = "#777777"  # reference lines (thresholds, zero)
MISSING_FACE = "#f3f3f3"

GROUP_COLORS = {
    "STEP SIZE": "#dfe8f5",
    "GRADIENTS": "#fbe7d8",
    "GRADIENT NOISE": "#efe6f5",
    "CURVATURE": "#dff0e5",
    "HYPERPARAMETERS": "#e9e9ee",
    "PERFORMANCE": "#e9e9ee",
    "LAYERWISE": "#f5f0dc",
    "LAYER HEALTH": "#f5f0dc",
    "DIAGNOSIS": "#f7e3e3",
}

TITLE_SIZE = 9
LABEL_SIZE = 8
TICK_SIZE = 7
LEGEND_SIZE = 6.5
NOTE_SIZE = 8
COLORBAR_SIZE = 6.5  # a colour bar's label and all its tick labels

LOG_SPAN = 30.0  # use a log axis when positive values span more than this factor


def layer_colors(n):
    """Return ``n`` colours for per-layer lines, in parameter order.

    Up to 10 layers get the qualitative ``tab10`` colours; more get evenly spaced
    ``viridis`` colours (dark = first parameter, yellow = last).
    """
    if n <= 0:
        return []
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    cmap = colormaps["viridis"]
    return [cmap(0.9 * i / (n - 1)) for i in range(n)]


def fmt(value, digits=3):
    """Format a number compactly for titles: 3 significant digits, ``nan`` if missing.

    ``0.0123``, ``4.56``, ``6110``, ``1.2e5``, ``3.4e-4``.
    """
    if value is None:
        return "–"
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    magnitude = abs(value)
    if value != 0 and (magnitude >= 1e5 or magnitude < 1e-3):
        mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    if magnitude >= 10**digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def percent(fraction):
    """A fraction as a percentage that never rounds a non-zero value to 0: ``0.03%``, ``1.3%``."""
    if fraction == 0:
        return "0%"
    if fraction < 0.001:
        return f"{100 * fraction:.1g}%"
    return f"{100 * fraction:.1f}%"


def short_name(name, width=18):
    """Shorten a parameter name for titles and legends, keeping its end."""
    name = str(name)
    return name if len(name) <= width else "…" + name[-(width - 1):]


def _compact(value, _pos=None):
    """Short tick label: ``0.05``, ``2.5``, ``6750``, ``1e5``, ``2.5e-4``."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        mantissa, exponent = f"{value:.1e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    if magnitude >= 1e3:
        return f"{value:.0f}"
    return f"{value:.3g}"


class _MinorLogFormatter(ticker.Formatter):
    """Label the minor ticks of a log axis only when it spans at most ~2 decades."""

    def __call__(self, value, pos=None):
        lo, hi = sorted(self.axis.get_view_interval())
        if lo <= 0 or hi / lo > 10**2.2:
            return ""
        return _compact(value)


def style_axes(ax, xlabel=None, ylabel=None, grid=True):
    """Apply the shared look: small ticks, light grid, compact number labels."""
    ax.tick_params(labelsize=TICK_SIZE, length=2.5, pad=1.5)
    ax.tick_params(which="minor", length=1.5)
    if xlabel is not None:
        ax.set_xlabel(xlabel, fontsize=LABEL_SIZE, labelpad=1)
    if ylabel is not None:
        ax.set_ylabel(ylabel, fontsize=LABEL_SIZE, labelpad=1)
    if grid:
        ax.grid(True, color="#e2e2e2", linewidth=0.6)
        ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    compact_yaxis(ax)


def compact_yaxis(ax, axis="y"):
    """Linear axes: at most 5 ticks with compact labels, never an offset text."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    if target.get_scale() == "linear":
        target.set_major_locator(ticker.MaxNLocator(nbins=5))
        target.set_major_formatter(ticker.FuncFormatter(_compact))


def step_axis(ax, log_steps=False, label=True):
    """Format the x axis as the training step (integer ticks, optional symlog)."""
    if log_steps:
        ax.set_xscale("symlog", linthresh=1)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(_compact))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    else:
        ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=6, integer=True))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(_compact))
    if label:
        ax.set_xlabel("step", fontsize=LABEL_SIZE, labelpad=1)


def set_title(ax, text):
    """Set a panel title (name plus key numbers), cut with "…" where it would be wider than the panel."""
    ax.set_title(fit(ax, text, TITLE_SIZE, bold=True), fontsize=TITLE_SIZE, fontweight="bold", pad=3)


def fit(ax, text, size, bold=False, slack=1.2):
    """``text`` cut to about the width of ``ax`` (estimated from its place before the layout).

    Only inside a layout of panels (an Axes of a ``SubFigure``, as the dashboard draws),
    where a long title would run into the next panel; a gauge drawn on an Axes of its
    own keeps its whole title.
    """
    if type(getattr(ax, "figure", None)).__name__ != "SubFigure":
        return text
    try:
        width = ax.get_window_extent().width * 72 / ax.figure.dpi * slack  # points
    except Exception:  # noqa: BLE001 - no figure to measure: leave it
        return text
    chars = int(width / (size * (0.58 if bold else 0.52)))
    text = str(text)
    if chars < 8 or len(text) <= chars or "\n" in text:
        return text
    parts = text.split(" · ")
    while len(parts) > 1 and len(" · ".join(parts)) > chars:  # drop whole trailing parts first
        parts.pop()
    text = " · ".join(parts)
    return text if len(text) <= chars else text[: chars - 1].rstrip(" ·,") + "…"


def auto_yscale(ax, *arrays, scale="auto"):
    """Choose a y scale from the values that will be drawn.

    ``"auto"``: ``log`` when all finite values are positive and span more than
    ``LOG_SPAN``; ``symlog`` when values of both signs span several decades;
    otherwise ``linear``. Any other string is applied as given.
    Returns the scale used.
    """
    if scale != "auto":
        chosen = scale
    else:
        values = np.concatenate([np.ravel(np.asarray(a, dtype=float)) for a in arrays]) if arrays else np.array([])
        values = values[np.isfinite(values)]
        chosen = "linear"
        if values.size >= 2:
            nonzero = np.abs(values[values != 0])
            if values.min() > 0 and values.max() / values.min() > LOG_SPAN:
                chosen = "log"
            elif values.min() < 0 and nonzero.size and nonzero.max() / max(np.percentile(nonzero, 10), 1e-300) > 1e3:
                chosen = "symlog"
    if chosen == "symlog":
        values = np.concatenate([np.ravel(np.asarray(a, dtype=float)) for a in arrays])
        nonzero = np.abs(values[np.isfinite(values) & (values != 0)])
        linthresh = float(np.percentile(nonzero, 10)) if nonzero.size else 1.0
        ax.set_yscale("symlog", linthresh=linthresh)
        ax.yaxis.set_major_locator(ticker.SymmetricalLogLocator(linthresh=linthresh, base=10))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(_compact))  # (matplotlib's: mathtext, drawn raw
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())          # where text is literal)
    else:
        ax.set_yscale(chosen)
        if chosen == "log":
            log_ticks(ax.yaxis)
        else:
            compact_yaxis(ax)
    return chosen


def log_ticks(axis):
    """Log axis ticks: at most ~5 labelled decades, minor ticks at 2 and 5 (labelled when
    the axis spans at most ~2 decades, so that a narrow log axis still has several labels)."""
    axis.set_major_locator(ticker.LogLocator(numticks=5))
    axis.set_major_formatter(ticker.FuncFormatter(_compact))
    axis.set_minor_locator(ticker.LogLocator(subs=(2.0, 5.0), numticks=12))
    axis.set_minor_formatter(_MinorLogFormatter())


def note(ax, text, color="#555555", face=MISSING_FACE):
    """Replace a panel's content by a centred message (e.g. "not tracked").

    The message takes no part in the layout: a long one (a flag's reason) would otherwise
    make constrained layout give up on the whole figure ("axes sizes collapsed to zero")."""
    ax.set_facecolor(face)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    message = ax.text(
        0.5,
        0.5,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=NOTE_SIZE,
        color=color,
        wrap=True,
    )
    message.set_in_layout(False)


def mark_steps(ax, steps, color=FLAG, label=None):
    """Draw short ticks at the bottom of a step axis for the given steps (one artist)."""
    steps = sorted(steps)
    if not steps:
        return None
    return ax.vlines(steps, 0.0, 0.09, transform=ax.get_xaxis_transform(), colors=color, linewidth=2.0,
                     zorder=5, label=label, clip_on=False)


def legend(ax, handles=None, loc="best", ncol=1, **kwargs):
    """A small, semi-transparent legend."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
        if not handles:
            return None
        return ax.legend(handles, labels, loc=loc, ncol=ncol, fontsize=LEGEND_SIZE, framealpha=0.7,
                         handlelength=1.5, borderpad=0.3, labelspacing=0.25, columnspacing=0.8, **kwargs)
    return ax.legend(handles=handles, loc=loc, ncol=ncol, fontsize=LEGEND_SIZE, framealpha=0.7,
                     handlelength=1.5, borderpad=0.3, labelspacing=0.25, columnspacing=0.8, **kwargs)
