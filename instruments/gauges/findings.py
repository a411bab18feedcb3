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

from .. import data, style
from ._common import missing, not_tracked

TITLE = "Diagnosis"
KEYS = (data.log.FINDINGS,)

#: record keys only the diagnosis writes (their presence means it ran).
SIGNALS = ("ActivationStats", "NonfiniteOrigin", "GradPresence", "InputStats", "ParamNorm")

SEVERITY_COLORS = {"error": style.FLAG, "warning": style.SECONDARY}

MARK = "finding"
"""The ``gid`` of the marker lines (to tell them from the gauges' own lines)."""

#: finding kind -> the time-axis gauges whose curves show it (marked at the finding's step).
CONCERNS = {
    "lr_too_high": ("performance", "grad_norm", "distance"),
    "lr_too_low": ("performance", "distance", "grad_norm"),
    "exploding_gradients": ("grad_norm",),
    "vanishing_gradients": ("grad_norm",),
    "dead_relu": ("performance",),
    "saturated_activations": ("performance",),
    "unnormalized_inputs": ("performance",),
    "missing_zero_grad": ("grad_norm", "performance"),
    "shuffled_labels": ("performance",),
    "nan_loss": ("performance", "grad_norm"),
    "noise_dominates": ("gradient_tests", "mean_gsnr", "grad_variance"),
    "edge_of_stability": ("max_ev", "performance"),
    "overfitting": ("performance", "early_stopping"),
}


def findings_of(record):
    """The findings in ``record`` (dicts), in step order, as the Cockpit wrote them."""
    out = []
    for step in sorted(record):
        out += [f for f in record[step].get(data.log.FINDINGS, []) if isinstance(f, dict)]
    return out


def gauge(record, ax, *, width=88, max_findings=6, **options):
    """List the findings of ``record`` on ``ax`` (a text panel, no axes).

    Args:
        width: characters per line before wrapping.
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
    y, lines_left, shown = 0.98, 15, 0
    for number, finding in enumerate(found[:max_findings], 1):
        color = SEVERITY_COLORS.get(finding.get("severity"), style.TOTAL)
        layer = finding.get("layer")
        head = f"{number}. step {finding.get('step')} · {finding.get('kind')}" + (f" [{layer}]" if layer else "")
        body = _lines(finding.get("message", ""), width, 2)
        fix = _lines("→ " + str(finding.get("suggestion", "")), width, 1)
        if lines_left < 1 + len(body):
            break
        if lines_left < 1 + len(body) + len(fix) or len(found) > 3:
            fix = []  # many findings: the messages first, the fixes are in the printed report
        ax.text(0.0, y, head, transform=ax.transAxes, fontsize=style.LEGEND_SIZE + 1, fontweight="bold",
                color=color, va="top", ha="left")
        y -= 0.075
        for line in body + fix:
            ax.text(0.015, y, line, transform=ax.transAxes, fontsize=style.LEGEND_SIZE, color="#333333",
                    va="top", ha="left", style="italic" if line.startswith("→") else "normal")
            y -= 0.065
        lines_left -= 1 + len(body) + len(fix)
        y -= 0.012
        shown = number
    if shown < len(found):
        ax.text(1.0, 0.0, f"+{len(found) - shown} more: python -m instruments diagnose RUN.jsonl",
                transform=ax.transAxes, fontsize=style.LEGEND_SIZE, color=style.REFERENCE, ha="right", va="bottom")


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
            if ax is None or not ax.lines:
                continue
            limits = ax.get_xlim()
            ax.axvline(step, color=color, linestyle="--", linewidth=1.0, alpha=0.8, zorder=4, gid=MARK)
            height = 0.98 - 0.09 * (len(marked.get(name, ())) % 4)  # stagger the numbers of close steps
            ax.text(step, height, f" {number}", transform=ax.get_xaxis_transform(), color=color,
                    fontsize=style.LEGEND_SIZE + 0.5, fontweight="bold", va="top", ha="left", zorder=6)
            ax.set_xlim(limits)
            marked.setdefault(name, []).append(number)
    return marked
