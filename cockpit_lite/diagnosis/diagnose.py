"""Run the rules over a record: live, step by step (``Diagnosis``), or offline (``diagnose``).

Both feed the rules the same entries in step order, so they give the same findings.
A step is fed once it is *settled*: live, when a later step has been recorded (values
of two-step quantities such as ``UpdateSize`` arrive one step late), and the newest
step when the findings are read (``Cockpit.findings``, ``report``, ``close``).

After the first non-finite loss every signal is contaminated (the parameters are
usually NaN after the next update): later steps raise no new finding.

A rule that raises is switched off for the rest of the run; the failure becomes a
flag string (recorded by the Cockpit) and a logged warning, never an exception.
"""

import logging
import os

from cockpit_lite import log as _log
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import History
from cockpit_lite.diagnosis.rules import RULES

LOGGER = logging.getLogger("cockpit_lite.diagnosis")
FINDINGS = _log.FINDINGS
"""The record key under which the Cockpit writes the findings of a step."""


class Diagnosis:
    """Incremental diagnosis of one run.

    Args:
        names: the tracked parameters' names (record order).
        shapes: their shapes (tell weights from biases), optional.
        rules: rule classes (default: ``RULES``).
    """

    def __init__(self, names=None, shapes=None, rules=RULES):
        self.history = History(names, shapes)
        self.rules = [rule() for rule in rules]
        self.findings = []
        self.failures = []
        self._keys = set()
        self.last = None

    def feed(self, step, entry):
        """Run every rule on one settled step; returns ``(new findings, failure flags)``."""
        step = int(step)
        self.last = step
        self.history.update(step, entry)
        new, flags = [], []
        if self.history.nonfinite_at is not None and step > self.history.nonfinite_at:
            return new, flags
        for rule in list(self.rules):
            try:
                found = rule.observe(step, entry, self.history) or []
            except Exception as error:  # a rule must never stop training
                self.rules.remove(rule)
                flag = f"diagnosis: rule {rule.KIND} failed at step {step} ({type(error).__name__}: {error}); switched off"
                LOGGER.warning("cockpit-lite %s", flag)
                self.failures.append(flag)
                flags.append(flag)
                continue
            for finding in found:
                if finding.key not in self._keys:
                    self._keys.add(finding.key)
                    new.append(finding)
        self.findings.extend(new)
        return new, flags

    def feed_record(self, record, upto=None):
        """Feed every step of ``record`` after the last fed one (up to ``upto``, inclusive)."""
        new, flags = [], []
        for step in sorted(record):
            if (self.last is not None and step <= self.last) or (upto is not None and step > upto):
                continue
            found, failed = self.feed(step, record[step])
            new += found
            flags += failed
        return new, flags


def _source(source, segment=-1, limits=None):
    """``(record, names, shapes)`` of a record dict, a Cockpit or a log path.

    A log path is read (and validated) by ``cockpit_lite.log``: its last run segment
    unless ``segment`` names another; a file that is not a record raises
    ``ValueError`` naming the file, the line and the field.
    """
    if hasattr(source, "get_output"):
        params = getattr(source, "params", None)
        shapes = [tuple(p.shape) for p in params] if params is not None else None
        return source.get_output(), getattr(source, "names", None), shapes
    if isinstance(source, dict):
        return {int(k): v for k, v in source.items()}, None, None
    path = os.fspath(source)
    if path.endswith(".jsonl"):
        header, record = _log.read_jsonl(path, segment, limits)
        params = header.get("params") or []
        return record, [p["name"] for p in params] or None, [p.get("shape") or [] for p in params] or None
    if segment not in (0, -1):
        raise ValueError(f"{path}: a .json file holds one run; segment={segment!r} does not exist")
    return _log.read_json(path, limits), None, None


def diagnose(source, names=None, segment=-1, limits=None):
    """The findings of a run: ``source`` is a record dict, a ``Cockpit`` or a ``.jsonl``/``.json`` log.

    Args:
        source: what to diagnose. A ``.jsonl`` log names its parameters in its header;
            for a record dict or a ``.json`` file pass ``names`` to get layer names.
        names: parameter names in record order (overrides the source's).
        segment: for a ``.jsonl`` log that several runs appended to, which run segment
            (``-1``: the last, as every reader; an index or a run id).
        limits: reader bounds (``cockpit_lite.log.LIMITS``) for a file source.

    Returns:
        ``list[Finding]``, in the order they were first seen.

    Raises:
        ValueError: for a file that is not a record (naming the file, the line and
            the field) or one beyond ``limits``.
    """
    record, found_names, shapes = _source(source, segment, limits)
    diagnosis = Diagnosis(names or found_names, shapes if not names else None)
    diagnosis.feed_record(record)
    return diagnosis.findings


def recorded(record):
    """The findings a live Cockpit wrote into ``record`` (its ``"findings"`` keys), in step order."""
    out = []
    for step in sorted(record):
        out += [Finding.from_dict(f) for f in record[step].get(FINDINGS, [])]
    return out
