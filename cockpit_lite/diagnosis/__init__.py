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
from cockpit_lite.diagnosis.report import format_report, report
from cockpit_lite.diagnosis.rules import RULES
from cockpit_lite.diagnosis.signals import DENSE_STEPS, EVERY, SIGNAL_OPTIONS, SIGNALS, SPARSE, schedule

__all__ = ["DENSE_STEPS", "EVERY", "FINDINGS", "KINDS", "LOGGER", "RULES", "SIGNALS", "SIGNAL_OPTIONS", "SPARSE",
           "Diagnosis", "Finding", "diagnose", "format_report", "recorded", "report", "schedule"]
