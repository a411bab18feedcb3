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
from cockpit_lite.diagnosis.history import History, Streak
from cockpit_lite.diagnosis.precedence import ordered
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

    def state_dict(self):
        """The diagnosis so far, in plain values: what a resumed run needs to go on where this one is.

        ``{"history": the running summaries, "rules": {kind: the rule's attributes} (a rule
        switched off is absent), "findings": [Finding.to_dict()], "failures": [flag],
        "reported": [(kind, layer)], "last": the last step fed}``. Values are Python values
        (a ``Streak`` as ``{"__streak__": its attributes}``) and the record's numpy arrays.
        """
        history = {k: _save(v) for k, v in vars(self.history).items()
                   if k not in ("names", "shapes") and not k.startswith("_")}  # (private: caches)
        return {
            "history": history,
            "rules": {rule.KIND: {k: _save(v) for k, v in vars(rule).items()} for rule in self.rules},
            "findings": [f.to_dict() for f in self.findings],
            "failures": list(self.failures),
            "reported": [tuple(key) for key in self._keys],
            "last": self.last,
        }

    def load_state_dict(self, state):
        """Go on from ``state_dict()``'s dict: no finding is reported twice, no rule starts over.

        Raises:
            ValueError: for the state of another set of rules (another version).
        """
        saved = state.get("rules", {}) if isinstance(state, dict) else {}
        known = {rule.KIND: rule for rule in self.rules}
        unknown = sorted(set(saved) - set(known))
        changed = sorted(k for k in saved if k in known and not (  # attributes set later are class defaults first
            set(vars(known[k])) <= set(saved[k]) and all(hasattr(known[k], a) for a in saved[k])))
        if not isinstance(state, dict) or unknown or changed or set(state) != {
                "history", "rules", "findings", "failures", "reported", "last"}:
            raise ValueError(
                f"the saved diagnosis state is not this version's (rules unknown here: {unknown}, rules whose "
                f"state differs: {changed}). Fix: resume with the cockpit-lite version that saved it"
            )
        for key, value in state["history"].items():
            setattr(self.history, key, _load(value))
        self.rules = [rule for rule in self.rules if rule.KIND in saved]  # a rule switched off stays off
        for rule in self.rules:
            for key, value in saved[rule.KIND].items():
                setattr(rule, key, _load(value))
        self.findings = [Finding.from_dict(f) for f in state["findings"]]
        self.failures = list(state["failures"])
        self._keys = {tuple(key) for key in state["reported"]}
        self.last = state["last"]

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


def _save(value):
    """A rule's or the history's attribute in plain values (``Streak`` objects tagged)."""
    if isinstance(value, Streak):
        return {"__streak__": {k: _save(v) for k, v in vars(value).items()}}
    if isinstance(value, (list, tuple)):
        return type(value)(_save(v) for v in value)
    if isinstance(value, dict):
        return {k: _save(v) for k, v in value.items()}
    return value


def _load(value):
    if isinstance(value, dict) and value.keys() == {"__streak__"}:
        streak = Streak(0)
        for key, item in value["__streak__"].items():
            setattr(streak, key, _load(item))
        return streak
    if isinstance(value, (list, tuple)):
        return type(value)(_load(v) for v in value)
    if isinstance(value, dict):
        return {k: _load(v) for k, v in value.items()}
    return value


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
        ``list[Finding]``, causes first: each root (in the order first seen) followed by
        the findings it probably caused (``cockpit_lite.diagnosis.precedence``).

    Raises:
        ValueError: for a file that is not a record (naming the file, the line and
            the field) or one beyond ``limits``.
    """
    record, found_names, shapes = _source(source, segment, limits)
    diagnosis = Diagnosis(names or found_names, shapes if not names else None)
    diagnosis.feed_record(record)
    return [f for f, _ in ordered(diagnosis.findings)]


def recorded(record):
    """The findings a live Cockpit wrote into ``record`` (its ``"findings"`` keys), causes first
    (as ``diagnose``; the log keeps them in the order they were found)."""
    out = []
    for step in sorted(record):
        out += [Finding.from_dict(f) for f in record[step].get(FINDINGS, [])]
    return [f for f, _ in ordered(out)]
