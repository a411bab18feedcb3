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
- The first entries matter most: later findings are often consequences of the first
  (dead units after a blown-up step, NaN after divergence).
- ``python -m instruments diagnose RUN.jsonl`` prints the same findings and a
  per-layer table of the signals behind them.
"""

import textwrap

from matplotlib import patheffects
from matplotlib.offsetbox import AnchoredOffsetbox, TextArea, VPacker

from .. import data, style
from ._common import missing, not_tracked

TITLE = "Diagnosis"
KEYS = (data.log.FINDINGS,)

#: record keys only the diagnosis writes (their presence means it ran).
SIGNALS = ("ActivationStats", "NonfiniteOrigin", "GradPresence", "InputStats", "ParamNorm")

SEVERITY_COLORS = {"error": style.FLAG, "warning": style.SECONDARY, "info": style.REFERENCE}

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
    """The findings in ``record`` (dicts), in step order, as the Cockpit wrote them."""
    out = []
    for step in sorted(record):
        out += [f for f in record[step].get(data.log.FINDINGS, []) if isinstance(f, dict)]
    return out


def gauge(record, ax, *, width=None, max_findings=6, **options):
    """List the findings of ``record`` on ``ax`` (a text panel, no axes).

    Args:
        width: characters per line before wrapping (default: as many as the panel is wide, at least 88).
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
    capacity, chars = _capacity(ax, width)
    size = style.LEGEND_SIZE + (1.5 if capacity > 30 else 0)  # a large panel: larger type
    if size != style.LEGEND_SIZE:
        capacity, chars = _capacity(ax, width, size)
    width = chars
    lines_left, shown, children = capacity, 0, []
    for number, finding in enumerate(found[:max_findings], 1):
        color = SEVERITY_COLORS.get(finding.get("severity"), style.TOTAL)
        layer = finding.get("layer")
        head = f"{number}. step {finding.get('step')} · {finding.get('kind')}" + (f" [{layer}]" if layer else "")
        body = _lines(finding.get("message", ""), width, 3 if capacity > 24 else 2)
        fix = _lines("→ " + str(finding.get("suggestion", "")), width, 2 if capacity > 24 else 1)
        if lines_left < 1 + len(body) + (1 if number < len(found) else 0):
            break
        if lines_left < 1 + len(body) + len(fix) or len(found) * (2 + len(body)) > capacity:
            fix = []  # many findings: the messages first, the fixes are in the printed report
        children.append(TextArea(head, textprops=dict(fontsize=size + 1, fontweight="bold",
                                                      color=color)))
        for line in body + fix:
            children.append(TextArea("   " + line, textprops=dict(
                fontsize=size, color="#333333", style="italic" if line.startswith("→") else "normal")))
        lines_left -= 1 + len(body) + len(fix)
        shown = number
    if children:
        box = VPacker(children=children, align="left", pad=0, sep=2)
        ax.add_artist(AnchoredOffsetbox(loc="upper left", child=box, pad=0, borderpad=0, frameon=False,
                                        bbox_to_anchor=(0, 1), bbox_transform=ax.transAxes))
    if shown < len(found):
        ax.text(1.0, 0.0, f"+{len(found) - shown} more: python -m instruments diagnose RUN.jsonl",
                transform=ax.transAxes, fontsize=style.LEGEND_SIZE, color=style.REFERENCE, ha="right", va="bottom")


def _capacity(ax, width=None, size=style.LEGEND_SIZE):
    """``(lines, characters per line)`` that fit in ``ax`` (from its place in the figure before layout)."""
    try:
        box = ax.get_window_extent()  # pixels, before the layout (close to the final size)
        height, wide = box.height * 72 / ax.figure.dpi, box.width * 72 / ax.figure.dpi  # points
    except Exception:  # noqa: BLE001 - no figure yet: the old fixed budget
        return 15, width or 88
    lines = max(4, int(0.88 * height / (size * 1.45)) - 1)
    return lines, width or max(88, min(140, int(0.9 * wide / (size * 0.55))))


def _lines(text, width, most):
    """``text`` wrapped to at most ``most`` lines of ``width`` characters (``…`` where cut)."""
    lines = textwrap.wrap(str(text), width)
    if len(lines) > most:
        lines = lines[:most]
        lines[-1] = lines[-1][: width - 2] + " …"
    return lines


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
