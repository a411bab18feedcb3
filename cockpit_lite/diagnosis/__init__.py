"""Diagnosis: plain-language findings from the record, live and offline.

Rules (``cockpit_lite.diagnosis.rules``, one file each) are pure functions of the
record: no torch, no model. They run live inside the ``Cockpit`` (after each step's
record) and offline on a log (``diagnose("run.jsonl")``) with the same result. Their
thresholds are documented once, in ``cockpit_lite.diagnosis.thresholds``.

``SIGNALS`` names the quantities the rules need; ``Cockpit(model)`` tracks them by
default (``cockpit_lite.quantities``: ``ActivationStats``, ``NonfiniteOrigin``,
``GradPresence``, ``InputStats``, ``ParamNorm`` plus ``Loss``, ``GradNorm`` and
``UpdateSize``). Richer quantities (``GradVariance``, ``NormTest``, ``HessMaxEV``) are
used when they are tracked too.
"""

from cockpit_lite.diagnosis.diagnose import FINDINGS, LOGGER, Diagnosis, diagnose, recorded
from cockpit_lite.diagnosis.finding import KINDS, Finding
from cockpit_lite.diagnosis.report import format_report
from cockpit_lite.diagnosis.rules import RULES

SIGNALS = (
    "Loss", "GradNorm", "ParamNorm", "UpdateSize", "ActivationStats", "NonfiniteOrigin", "GradPresence",
    "InputStats",
)
"""Quantity class names (``cockpit_lite.quantities.REGISTRY``) the diagnosis collects by default."""

SIGNAL_OPTIONS = {"Loss": {"required": False}}
"""Constructor arguments of the signals the Cockpit adds (a step without info['loss'] still runs)."""


def report(source, names=None):
    """The text report of ``source`` (record dict, Cockpit or log path); see ``format_report``."""
    from cockpit_lite.diagnosis.diagnose import _source

    record, found, _ = _source(source)
    findings = source.findings if hasattr(source, "findings") else diagnose(source, names)
    return format_report(findings, record, names or found)


__all__ = ["Diagnosis", "Finding", "KINDS", "RULES", "SIGNALS", "FINDINGS", "diagnose", "recorded", "report",
           "format_report"]
