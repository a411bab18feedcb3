"""Drawing building blocks shared by the gauges (not a gauge itself)."""

import textwrap

import numpy as np
from matplotlib import patheffects, transforms

from cockpit_lite import intervals, log

from .. import data, style


def missing(record):
    """A predicate factory: ``missing(record)(*keys)`` -> list of untracked keys."""
    present = set()
    for entry in record.values():
        present.update(entry)
    return lambda *keys: [k for k in keys if k not in present]


def hint(keys):
    """How one would get ``keys`` into a record (for "not tracked" messages)."""
    epoch = [k for k in keys if k in data.log.EPOCH_KEYS]
    levels = [data.LEVELS.get(k) for k in keys if k not in epoch]
    if epoch and not levels:
        return "log it with cockpit.log(...)"
    order = ["economy", "business", "full"]
    known = [lv for lv in levels if lv in order]
    if known and len(known) == len(levels):
        level = max(known, key=order.index)
        return f"in configuration('{level}')"
    return "add the quantity to the cockpit"


def not_tracked(ax, title, keys):
    """Draw the "not tracked" panel for a gauge whose quantities are absent."""
    style.set_title(ax, title)
    keys = list(keys)
    style.note(ax, "not tracked\n" + ", ".join(keys) + " missing from the record\n(" + hint(keys) + ")")


def no_finite(ax, title, keys, record=None):
    """Draw the panel for a quantity that is tracked but has no finite value, with the reason
    the record's newest flag on it gives (its first sentence), if any."""
    style.set_title(ax, title)
    text = "tracked, but no finite value yet\n(" + ", ".join(keys) + " is NaN/Inf at every step)"
    reason = _flagged_reason(record or {}, keys)
    if reason:
        text += "\n\n" + "\n".join(textwrap.wrap(reason, 48, break_on_hyphens=False)[:6])
    style.note(ax, text, color=style.FLAG)


def _flagged_reason(record, keys):
    """The first sentence of the newest flag that starts with one of ``keys`` (``"TICDiag: ..."``)."""
    for step in sorted(record, reverse=True):
        flags = record[step].get("flags") if isinstance(record[step], dict) else None
        for flag in reversed(flags if isinstance(flags, list) else []):
            if isinstance(flag, str) and any(flag.startswith(f"{key}:") for key in keys):
                return flag.split(". ")[0].rstrip(".") + "."
    return None


def draw_error(ax, title, error):
    """Draw a panel that failed (the dashboard keeps going)."""
    ax.clear()
    style.set_title(ax, title)
    style.note(ax, f"could not draw:\n{type(error).__name__}: {str(error)[:80]}", color=style.FLAG)


def raw_and_smooth(ax, xs, ys, color, label=None, smooth=True, marker_size=2.5, linewidth=1.6, raw="dots",
                   linestyle="-"):
    """Raw values (dots, or a thin line) plus a bold smoothed line (``data.smooth``). NaNs skipped."""
    xs, ys = data.finite(np.asarray(xs, float), np.asarray(ys, float))
    if len(xs) == 0:
        return None
    if raw == "dots" or len(xs) == 1:
        ax.plot(xs, ys, linestyle="none", marker="o", markersize=marker_size,
                color=color, alpha=0.45, markeredgewidth=0, label=None if smooth and len(xs) > 2 else label)
    else:
        ax.plot(xs, ys, color=color, alpha=0.35, linewidth=0.8, label=None if smooth and len(xs) > 2 else label)
    if smooth and len(xs) > 2:
        (line,) = ax.plot(xs, data.smooth(ys), color=color, linewidth=linewidth, label=label, linestyle=linestyle)
        return line
    return None


#: Marker size of a series of one point (e.g. the epoch values after one epoch).
LONE_MARKER = 7


def marker_style(n, size):
    """Marker keywords for a series of ``n`` points: one point (one epoch so far) gets a large
    marker, drawn whole even on the panel's edge, so that it reads as a value, not a stray dot."""
    if n == 1:
        return dict(markersize=LONE_MARKER, markeredgecolor="white", markeredgewidth=0.8, clip_on=False, zorder=5)
    return dict(markersize=size)


def label_points(ax, points):
    """Write the value of each series of one point beside its marker.

    Args:
        ax: the panel (its twin axes share its box).
        points: ``[(axes, x, y, text, colour)]``, each point in the data of its ``axes``
            (``ax`` or a twin), whose limits are final.

    The texts go left of a point in the right half of the panel, right of it otherwise,
    and are moved apart vertically so that no two overlap.
    """
    height = ax.get_window_extent().height * 72 / ax.figure.dpi  # points
    size = style.LEGEND_SIZE + 0.5
    gap = 1.3 * size / max(height, 1.0)  # one line, as a fraction of the panel
    placed = []
    for axes, x, y, text, color in points:
        axes.get_xlim(), axes.get_ylim()  # settle the autoscaled limits
        fx, fy = (axes.transScale + axes.transLimits).transform((x, y))  # data -> fraction of the panel
        placed.append([fx, fy, text, color])
    placed.sort(key=lambda p: p[1])
    for below, above in zip(placed, placed[1:]):
        above[1] = max(above[1], below[1] + gap)
    shift = max(0.0, placed[-1][1] - (1 - gap / 2)) if placed else 0.0  # the top one inside the panel
    halo = [patheffects.withStroke(linewidth=2.5, foreground="white")]
    for fx, fy, text, color in placed:
        right = fx > 0.5
        offset = transforms.ScaledTranslation((-1 if right else 1) * LONE_MARKER / 72, 0, ax.figure.dpi_scale_trans)
        ax.text(fx, fy - shift, text, transform=ax.transAxes + offset, ha="right" if right else "left",
                va="center", color=color, fontsize=size, fontweight="bold", zorder=6, path_effects=halo)


#: More layers than this: only the ``TOP_K`` largest get a line (the heat maps show them all).
MAX_LINES = 16
TOP_K = 8
#: More points than this: lines are smoothed (``data.smooth``), so that a long run is not a smear.
SMOOTH_ABOVE = 300


def top_layers(matrix, k=TOP_K):
    """Column indices of the ``k`` layers with the largest median absolute value."""
    with np.errstate(all="ignore"):
        score = np.array([np.nanmedian(np.abs(c)) if np.isfinite(c).any() else -np.inf for c in matrix.T])
    return sorted(np.argsort(-score)[:k].tolist())


def layer_lines(ax, xs, matrix, colors=None, linewidth=0.8, alpha=0.85):
    """Thin lines, one per layer (column of ``matrix``); of many layers only the largest few.

    With more than ``MAX_LINES`` layers only the ``TOP_K`` largest (median absolute
    value) are drawn, in their colours of the shared legend, and the panel says so;
    with more than ``SMOOTH_ABOVE`` points each line is smoothed.
    """
    if matrix.size == 0:
        return []
    colors = colors or style.layer_colors(matrix.shape[1])
    columns = range(matrix.shape[1])
    if matrix.shape[1] > MAX_LINES:
        columns = top_layers(matrix)
        ax.text(0.99, 0.02, f"{len(columns)} largest of {matrix.shape[1]} layers", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=style.LEGEND_SIZE, color=style.REFERENCE)
    lines = []
    for j in columns:
        column = matrix[:, j]
        mask = np.isfinite(column)
        if mask.any():
            marker = "o" if mask.sum() < 3 else None
            ys = data.smooth(column[mask]) if mask.sum() > SMOOTH_ABOVE else column[mask]
            (line,) = ax.plot(xs[mask], ys, color=colors[j], linewidth=linewidth, alpha=alpha,
                              marker=marker, markersize=2.5)
            lines.append(line)
    return lines


def total_line(ax, xs, ys, label="total", color=style.TOTAL, linewidth=2.0):
    """The bold total line (markers when the quantity is sparse)."""
    xs, ys = data.finite(np.asarray(xs, float), np.asarray(ys, float))
    if len(xs) == 0:
        return None
    marker = "o" if len(xs) <= 12 else None
    if len(xs) > SMOOTH_ABOVE:  # a long run: the raw values faint, their moving average bold
        ax.plot(xs, ys, color=color, linewidth=0.5, alpha=0.25)
        ys = data.smooth(ys)
    (line,) = ax.plot(xs, ys, color=color, linewidth=linewidth, marker=marker, markersize=3.5, label=label)
    return line


def largest_layer(matrix, names, absolute=True):
    """``(name, value)`` of the layer with the largest last finite value, or ``(None, nan)``."""
    if matrix.size == 0:
        return None, float("nan")
    last = np.full(matrix.shape[1], np.nan)
    for j in range(matrix.shape[1]):
        column = matrix[:, j]
        column = column[np.isfinite(column)]
        if column.size:
            last[j] = column[-1]
    if not np.isfinite(last).any():
        return None, float("nan")
    score = np.abs(last) if absolute else last
    j = int(np.nanargmax(score))
    return style.short_name(names[j]) if j < len(names) else f"param_{j}", float(last[j])


def layer_names(record, options):
    """Layer names from the options (``params=[...]``) padded to the record's layer count."""
    n = data.n_layers(record)
    names = list(options.get("params") or [])
    if len(names) < n:
        names += [f"param_{i}" for i in range(len(names), n)]
    return names


def finish_time_axes(ax, options, ylabel=None):
    """Shared look of a panel whose x axis is the training step."""
    style.style_axes(ax, ylabel=ylabel)
    style.step_axis(ax, options.get("log_steps", False), label=options.get("step_label", True))
    span = options.get("step_range")
    if span is not None:  # align the step axes of all panels of a layout
        first, last = span
        pad = max(0.5, 0.02 * (last - first))
        ax.set_xlim(first - (0 if options.get("log_steps") else pad), last + pad)


def layered(record, ax, key, options, ylabel=None, layers=True, yscale="auto", color=style.TOTAL, label="total"):
    """Draw a per-layer quantity: thin coloured line per layer plus the bold total.

    Returns ``(xs, totals, matrix, names)`` (finite totals only) for the title.
    """
    xs, totals = data.finite(*data.series(record, key))
    lx, matrix = data.layer_series(record, key)
    names = layer_names(record, options)
    if layers and matrix.size and matrix.shape[1] > 1:
        layer_lines(ax, lx, matrix)
    total_line(ax, xs, totals, label=label, color=color)
    shown = [totals] + ([matrix] if layers and matrix.size else [])
    style.auto_yscale(ax, *shown, scale=yscale)
    finish_time_axes(ax, options, ylabel=ylabel)
    return xs, totals, matrix, names


def estimates(record, key):
    """``(steps, lows, highs, how, label)`` of the steps where ``key`` is an estimate (sorted): the
    interval of each at ``intervals.COVERAGE``.

    An estimate's ``meta`` has ``"se"`` (the total's, or ``"total_se"`` for a per-parameter
    list), ``"df"`` and ``"scale"`` (``cockpit_lite.intervals``; a record without ``"df"`` takes the
    normal quantile), or its own ``"interval"`` at ``"coverage"``; and ``"probes"`` (Hutchinson's)
    or ``"samples"`` of ``"of"`` (a subsample, ``Cockpit(samples=k)``). ``how`` names them for a
    title ("3 probes", "8/64 samples"), ``label`` the band for a legend ("95 % interval (t, 7 df)").
    """
    steps, values = data.series(record, key)
    xs, lows, highs, probes, samples, dfs, scales = [], [], [], set(), set(), set(), set()
    coverage = intervals.COVERAGE
    for step, value in zip(steps, values):
        meta = record[int(step)].get(log.META, {}).get(key) or {}
        if meta.get("probes") is not None:
            probes.add(meta["probes"])
        elif meta.get("samples") is not None:
            samples.add((meta["samples"], meta["of"]))
        se = meta.get("total_se", meta.get("se"))
        if not np.isfinite(value):
            continue
        if isinstance(meta.get("interval"), (list, tuple)) and meta.get("coverage") == coverage:
            low, high = meta["interval"]
        elif isinstance(se, (int, float)):
            low, high = intervals.interval(value, se, meta.get("df"), coverage, meta.get("scale"))
            dfs.add(meta.get("df"))
            scales.add(meta.get("scale") or "linear")
        else:
            continue
        if not (np.isnan(low) or np.isnan(high)):  # an infinite end is clipped when drawn
            xs.append(step)
            lows.append(float(low))
            highs.append(float(high))
    how = [f"{'/'.join(str(p) for p in sorted(probes))} probes"] if probes else []
    how += [f"{'/'.join(f'{k}/{b}' for k, b in sorted(samples))} samples"] if samples else []
    detail = ["t, " + "/".join(f"{d:g}" for d in sorted(dfs)) + " df" if dfs and None not in dfs else "normal"]
    detail += ["log scale"] if scales == {"log"} else []
    label = f"{100 * coverage:g} % interval ({', '.join(detail)})"
    return np.asarray(xs, float), np.asarray(lows, float), np.asarray(highs, float), how, label


def estimate_band(ax, record, key, color=style.TOTAL, label=True):
    """Shade the interval (``intervals.COVERAGE``) around the estimated values of ``key``, labelled
    for the legend unless ``label`` is false; return a title suffix (" · est. 3 probes",
    " · est. 8/64 samples"; empty when no value of ``key`` is an estimate)."""
    xs, lows, highs, how, text = estimates(record, key)
    if len(xs):
        steps, values = data.series(record, key)
        ys = values[np.isin(steps, xs)]
        # clipped to the values' own span around them, so a vague estimate cannot flatten the curve
        span = max(float(np.ptp(ys)), float(np.abs(ys).max()), 1e-12)
        low = np.maximum(lows, ys.min() - span)
        if ax.get_yscale() == "log":  # a band to 0 or below has no place on a log axis
            low = np.maximum(low, ys / 10)
        high = np.minimum(highs, ys.max() + span)
        ax.fill_between(xs, low, high, color=color, alpha=0.18, linewidth=0, label=text if label else None)
    return f" · est. {'; '.join(how)}" if how else ""
