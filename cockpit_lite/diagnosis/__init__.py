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

DENSE_STEPS = 10
"""The sparse signals are recorded at every one of the first ``DENSE_STEPS`` steps ..."""
EVERY = 10
"""... and then at every ``EVERY``-th step (``UpdateSize`` also looks at the step after)."""


def schedule(step):
    """The default schedule of the diagnosis signals: the first ``DENSE_STEPS`` steps, then every ``EVERY``-th.

    The rules count *records* (a streak of 3 records, 10 records before judging the
    learning rate), so a problem present from the start is found within the dense
    steps; one that appears later within a few ``EVERY`` steps. ``NonfiniteOrigin`` is
    not on it: it looks at every step's loss (and records only a non-finite one).
    """
    return step < DENSE_STEPS or step % EVERY == 0


SPARSE = ("Loss", "GradNorm", "ParamNorm", "UpdateSize", "ActivationStats", "GradPresence", "InputStats")
"""The signals the Cockpit tracks on ``schedule`` (the others at every step)."""

SIGNAL_OPTIONS = {name: {"track_schedule": schedule} for name in SPARSE}
SIGNAL_OPTIONS["Loss"]["required"] = False
"""Constructor arguments of the signals the Cockpit adds (``schedule``; a step without info['loss'] still runs)."""


def report(source, names=None):
    """The text report of ``source`` (record dict, Cockpit or log path); see ``format_report``."""
    from cockpit_lite.diagnosis.diagnose import _source

    record, found, _ = _source(source)
    findings = source.findings if hasattr(source, "findings") else diagnose(source, names)
    return format_report(findings, record, names or found)


__all__ = ["Diagnosis", "Finding", "KINDS", "RULES", "SIGNALS", "FINDINGS", "diagnose", "recorded", "report",
           "format_report"]
