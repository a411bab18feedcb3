"""The text report: findings first, then a per-layer table of activation and gradient statistics."""

import math

import numpy as np

from cockpit_lite.diagnosis.precedence import ordered


def _last(record, key):
    for step in sorted(record, reverse=True):
        if key in record[step]:
            return step, record[step][key]
    return None, None


def _num(value, width=9):
    if value is None:
        return "-".rjust(width)
    value = float(value)
    if not math.isfinite(value):
        return str(value).rjust(width)
    return f"{value:.3g}".rjust(width)


def _where(finding):
    return f" in {finding.layer!r}" if finding.layer is not None else ""


def format_report(findings, record, names=None):
    """The report as a string (see the module docstring): causes first, each consequence
    after its root with a line naming it (``cockpit_lite.diagnosis.precedence``)."""
    lines = [f"cockpit-lite diagnosis: {len(findings)} finding(s)"]
    if not findings:
        lines.append("  no problem found")
    for f, root in ordered(findings):
        lines.append(f"- [{f.severity}] {f.kind}{_where(f)}, step {f.step}")
        lines.append(f"    {f.message}")
        if root is not None:
            lines.append(f"    probably caused by {root.kind}{_where(root)} (step {root.step}): fix that first")
        lines.append(f"    fix: {f.suggestion}")

    step, stats = _last(record, "ActivationStats")
    if isinstance(stats, dict) and stats:
        lines += ["", f"activations (step {step}):",
                  f"  {'module':<24}{'type':<10}{'mean':>9}{'std':>9}{'zeros':>9}{'dead':>9}{'saturated':>10}"]
        for module, v in stats.items():
            lines.append(f"  {module[:23]:<24}{str(v.get('type'))[:9]:<10}{_num(v.get('mean'))}{_num(v.get('std'))}"
                         f"{_num(v.get('zeros'))}{_num(v.get('dead'))}{_num(v.get('saturated'), 10)}")

    step, grads = _last(record, "GradNorm")
    if isinstance(grads, (list, tuple, np.ndarray)) and len(grads):
        entry = record[step]
        params = entry.get("ParamNorm")
        update = entry.get("UpdateSize")
        lines += ["", f"parameters (step {step}):",
                  f"  {'parameter':<28}{'|grad|':>10}{'|param|':>10}{'|g|/|p|':>10}{'|update|/|p|':>13}"]
        for i, g in enumerate(grads):
            name = names[i] if names and i < len(names) else f"param_{i}"
            p = float(params[i]) if isinstance(params, (list, tuple, np.ndarray)) and i < len(params) else None
            u = float(update[i]) if isinstance(update, (list, tuple, np.ndarray)) and i < len(update) else None
            ratio = float(g) / p if p else None
            uratio = u / p if (p and u is not None) else None
            lines.append(f"  {name[:27]:<28}{_num(g, 10)}{_num(p, 10)}{_num(ratio, 10)}{_num(uratio, 13)}")
    step, inputs = _last(record, "InputStats")
    if isinstance(inputs, dict):
        lines += ["", f"inputs (step {step}): " + ", ".join(f"{k} {_num(v, 0).strip()}" for k, v in inputs.items())]
    return "\n".join(lines)


def report(source, names=None):
    """The text report of ``source`` (record dict, Cockpit or log path); see ``format_report``."""
    from cockpit_lite.diagnosis.diagnose import _source, diagnose  # (diagnose reads the rules, which read this)

    record, found, _ = _source(source)
    findings = source.findings if hasattr(source, "findings") else diagnose(source, names)
    return format_report(findings, record, names or found)
