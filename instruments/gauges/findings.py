"""Findings panel: what the diagnosis found, in words, numbered.

Reads the record's ``"findings"`` key (written by ``Cockpit(model)``, which diagnoses
by default, or by ``cockpit_lite.diagnose``): each finding is one numbered entry,
``n. step S · KIND [layer]``, coloured by severity (red: error, orange: warning),
followed by its message and the suggested fix. ``mark`` draws a dashed line with the
same number at the finding's step on the time axis of each gauge it concerns
(``CONCERNS``), so that the finding can be read against the curves that show it.

How to read it
- No entry: no rule fired ("no problem found"), or the record was written with
  ``diagnose=False`` (the panel says so; ``python -m instruments diagnose`` runs the
  rules offline on the log).
- Causes come first: a finding that is a measured consequence of another one (dead
  units after a blown-up step, a spiking loss after unnormalised inputs) follows its
  root, its head marked "← n." (probably caused by finding n;
  ``cockpit_lite.diagnosis.precedence``).
- ``python -m instruments diagnose RUN.jsonl`` prints the same findings and a
  per-layer table of the signals behind them.
"""

import textwrap

from matplotlib import patheffects
from matplotlib.font_manager import FontProperties
from matplotlib.offsetbox import AnchoredOffsetbox, TextArea, VPacker
from matplotlib.textpath import TextToPath

from .. import data, style
from ._common import missing, not_tracked

TITLE = "Diagnosis"
KEYS = (data.log.FINDINGS,)

#: record keys only the diagnosis writes (their presence means it ran).
SIGNALS = ("ActivationStats", "NonfiniteOrigin", "GradPresence", "InputStats", "ParamNorm")

SEVERITY_COLORS = {"error": style.FLAG, "warning": style.SECONDARY, "info": style.REFERENCE}

#: Font sizes tried for the findings, largest first (the first at which they all fit is used).
SIZES = (style.LEGEND_SIZE + 1.5, style.LEGEND_SIZE + 0.75, style.LEGEND_SIZE, style.LEGEND_SIZE - 1)
INDENT = "   "
SEP = 2  # points between the lines of an entry
#: a text line ``size`` points high takes LINE * size points (one line) plus SPACING * size for every further one.
LINE, SPACING = 1.17, 1.4
_TEXT_PATH = TextToPath()  # measures text without a renderer

MARK = "finding"
"""The ``gid`` of the marker lines (to tell them from the gauges' own lines)."""

#: finding kind -> the time-axis gauges whose curves show it (marked at the finding's step).
CONCERNS = {
    "lr_too_high": ("performance", "grad_norm", "distance", "update_ratio"),
    "lr_too_low": ("performance", "distance", "grad_norm", "update_ratio"),
    "exploding_gradients": ("grad_norm", "grad_ratio"),
    "vanishing_gradients": ("grad_norm", "grad_ratio"),
    "dead_relu": ("performance", "dead_units"),
    "saturated_activations": ("performance", "saturation"),
    "unnormalized_inputs": ("performance",),
    "missing_zero_grad": ("grad_norm", "performance"),
    "shuffled_labels": ("performance",),
    "nan_loss": ("performance", "grad_norm"),
    "noise_dominates": ("gradient_tests", "mean_gsnr", "grad_variance"),
    "edge_of_stability": ("max_ev", "performance"),
    "overfitting": ("performance", "early_stopping"),
}


def has_data(record):
    """Whether there is something to say: findings, or the signals a diagnosis reads ("no problem found")."""
    return bool(data.tracked(record, data.log.FINDINGS, *SIGNALS))


def findings_of(record):
    """The findings in ``record`` (dicts), causes first, as every report lists them
    (``cockpit_lite.diagnosis.precedence``): each root, then the findings it probably
    caused, each of those with ``"root"``, the 1-based number of its root in this list."""
    from cockpit_lite.diagnosis.finding import Finding
    from cockpit_lite.diagnosis.precedence import ordered

    raw = []
    for step in sorted(record):
        raw += [f for f in record[step].get(data.log.FINDINGS, []) if isinstance(f, dict)]
    found = [Finding.from_dict(f) for f in raw]
    dicts = {id(f): d for f, d in zip(found, raw)}
    pairs = ordered(found)
    number = {id(f): n for n, (f, _) in enumerate(pairs, 1)}
    return [dict(dicts[id(f)], root=number[id(r)]) if r is not None else dicts[id(f)] for f, r in pairs]


def gauge(record, ax, *, width=None, max_findings=6, **options):
    """List the findings of ``record`` on ``ax`` (a text panel, no axes).

    Every finding shown is shown whole (its message and its fix, wrapped, never cut): the
    font is the largest that fits them all in the panel, down to ``SIZES[-1]``; findings
    that still do not fit are counted at the bottom.

    Args:
        width: characters per line before wrapping (default: as many as the panel is wide).
        max_findings: entries shown (the rest are counted).
    """
    found = findings_of(record)
    if not found:
        present = missing(record)
        if present("Loss") and present(*SIGNALS) == list(SIGNALS):
            return not_tracked(ax, TITLE, KEYS)  # nothing a diagnosis could have read
        ax.set_axis_off()
        style.set_title(ax, "Diagnosis: no findings")
        style.note(ax, "no problem found" if present(*SIGNALS) != list(SIGNALS) else
                   "no findings in the record (diagnose=False?)\noffline: python -m instruments diagnose RUN.jsonl")
        return
    ax.set_axis_off()
    errors = sum(f.get("severity") == "error" for f in found)
    style.set_title(ax, f"Diagnosis: {len(found)} finding(s), {errors} error(s)")
    size, entries = _fit(found[:max_findings], _room(ax), width)
    children = []
    for number, (finding, (head, body, fix)) in enumerate(zip(found, entries), 1):
        color = SEVERITY_COLORS.get(finding.get("severity"), style.TOTAL)
        children.append(TextArea("\n".join(head), textprops=dict(fontsize=size + 1, fontweight="bold",
                                                                  color=color)))
        for lines, italic in ((body, False), (fix, True)):
            if lines:
                children.append(TextArea("\n".join(INDENT + line for line in lines), textprops=dict(
                    fontsize=size, color="#333333", style="italic" if italic else "normal")))
    box = VPacker(children=children, align="left", pad=0, sep=SEP)
    ax.add_artist(AnchoredOffsetbox(loc="upper left", child=box, pad=0, borderpad=0, frameon=False,
                                    bbox_to_anchor=(0, 1), bbox_transform=ax.transAxes))
    if len(entries) < len(found):
        ax.text(1.0, 0.0, f"+{len(found) - len(entries)} more: python -m instruments diagnose RUN.jsonl",
                transform=ax.transAxes, fontsize=style.LEGEND_SIZE, color=style.REFERENCE, ha="right", va="bottom")


def _room(ax):
    """``(width, height)`` in points for the text in ``ax``, estimated before the layout: the cell of
    its grid in its (sub)figure (which the layout fills, the panel having no axes), less the titles
    and the figure's legend."""
    spec = ax.get_subplotspec()
    if spec is None:  # an Axes placed by hand: its own box
        width, height = ax.get_window_extent().size
    else:
        grid = spec.get_gridspec()
        widths, heights = grid.get_width_ratios(), grid.get_height_ratios()
        width = ax.figure.bbox.width * sum(widths[i] for i in spec.colspan) / sum(widths)
        height = ax.figure.bbox.height * sum(heights[i] for i in spec.rowspan) / sum(heights)
    scale = 72 / ax.figure.dpi
    return 0.97 * width * scale, 0.92 * height * scale - 3.5 * style.TITLE_SIZE


def _fit(found, room, width=None):
    """``(size, [(head lines, message lines, fix lines)])``: the findings wrapped at the largest of
    ``SIZES`` at which all fit in ``room``; at the smallest, as many as fit whole (at least one)."""
    for size in SIZES:
        entries = [_entry(number, finding, size, room, width) for number, finding in enumerate(found, 1)]
        heights = [_height(entry, size) for entry in entries]
        if sum(heights) <= room[1]:
            return size, entries
    budget = room[1] - LINE * style.LEGEND_SIZE  # the "+n more" line
    shown = 1
    while shown < len(entries) and sum(heights[: shown + 1]) <= budget:
        shown += 1
    return size, entries[:shown]


def _entry(number, finding, size, room, width=None):
    """One finding's lines: its head (number, step, kind, layer), its message and its fix."""
    layer = finding.get("layer")
    head = f"{number}. step {finding.get('step')} · {finding.get('kind')}" + (f" [{layer}]" if layer else "")
    if finding.get("root") is not None:
        head += f" ← {finding['root']}."  # probably caused by finding number root
    message, suggestion = str(finding.get("message", "")), str(finding.get("suggestion", ""))

    def wrap(text, prop):
        if width is not None:
            return textwrap.wrap(text, width, break_on_hyphens=False)
        return _wrap(text, room[0] - _width(INDENT, prop), prop)

    return (wrap(head, FontProperties(size=size + 1, weight="bold")),
            wrap(message, FontProperties(size=size)) if message else [],
            wrap("→ " + suggestion, FontProperties(size=size, style="italic")) if suggestion else [])


def _height(entry, size):
    """Height in points of one entry as ``gauge`` packs it (head one size larger)."""
    parts = [(len(lines), size + (1 if i == 0 else 0)) for i, lines in enumerate(entry) if lines]
    return sum(LINE * s + SPACING * s * (n - 1) + SEP for n, s in parts)


def _width(text, prop):
    """Width of ``text`` in points in the font ``prop`` (with the renderer's hinting to spare)."""
    return 1.06 * _TEXT_PATH.get_text_width_height_descent(text, prop, ismath=False)[0]


def _wrap(text, room, prop):
    """``text`` wrapped into lines no wider than ``room`` points in the font ``prop``."""
    chars = max(12, int(room * len(text) / max(_width(text, prop), 1e-9)))
    while True:
        lines = textwrap.wrap(text, chars, break_on_hyphens=False)
        if chars <= 12 or max(_width(line, prop) for line in lines) <= room:
            return lines
        chars -= 1


def mark(record, axes):
    """Mark each finding's step, numbered as in the panel, on the gauges it concerns.

    Args:
        record: the record.
        axes: ``{gauge name: Axes}`` of a drawn layout (``Dashboard.axes``); gauges
            that drew no curve ("not tracked") are left alone.

    Returns:
        ``{gauge name: [finding numbers marked]}``.
    """
    marked = {}
    for number, finding in enumerate(findings_of(record), 1):
        step = finding.get("step")
        if step is None:
            continue
        color = SEVERITY_COLORS.get(finding.get("severity"), style.TOTAL)
        for name in CONCERNS.get(finding.get("kind"), ()):
            ax = axes.get(name)
            if ax is None or not (ax.lines or ax.collections or ax.images):
                continue
            limits = ax.get_xlim()
            halo = [patheffects.withStroke(linewidth=2.5, foreground="white")]
            ax.axvline(step, color=color, linestyle="--", linewidth=1.0, alpha=0.9, zorder=4, gid=MARK,
                       path_effects=halo)
            height = 0.98 - 0.09 * (len(marked.get(name, ())) % 4)  # stagger the numbers of close steps
            ax.text(step, height, f" {number}", transform=ax.get_xaxis_transform(), color=color,
                    fontsize=style.LEGEND_SIZE + 0.5, fontweight="bold", va="top", ha="left", zorder=6,
                    path_effects=halo)
            ax.set_xlim(limits)
            marked.setdefault(name, []).append(number)
    return marked
