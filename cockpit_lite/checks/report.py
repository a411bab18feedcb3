"""Results of the pre-flight checks: ``CheckResult`` (one check) and ``Report`` (all of them).

A check has four outcomes, never two: passed (``passed is True``), failed
(``passed is False``), skipped (``passed is None``: it does not apply to this
set-up, ``message`` says why) and inconclusive (``passed is None`` and
``inconclusive``: it applies, but the data it was given cannot decide it; ``message``
says why and ``fix`` what to pass so that it can). Only a failure fails a run:
``raise_if_failed`` raises with an explicit ``raise AssertionError`` so that
``python -O`` cannot strip it.
"""

import math
from dataclasses import dataclass, field

PASSED, FAILED, SKIPPED, INCONCLUSIVE = "passed", "failed", "skipped", "inconclusive"
_LABEL = {PASSED: "PASS", FAILED: "FAIL", SKIPPED: "SKIP", INCONCLUSIVE: "????"}


@dataclass
class CheckResult:
    """The outcome of one check.

    Attributes:
        name: the check's name (e.g. ``"init_loss"``).
        passed: True, False, or None when the check was skipped or is inconclusive.
        value: the measured number the threshold applies to (None if skipped).
        threshold: the limit, as text with its direction (e.g. ``"<= 1.5"``).
        message: what was measured (or why the check was skipped), in words.
        fix: how to fix a failure, or (inconclusive) what to pass to decide (empty when
            there is nothing to do).
        seconds: time the check took.
        inconclusive: with ``passed`` None: the data given cannot decide the check.
    """

    name: str
    passed: bool | None
    value: float | None = None
    threshold: str = ""
    message: str = ""
    fix: str = ""
    seconds: float = field(default=0.0, compare=False)
    inconclusive: bool = False

    @classmethod
    def skip(cls, name, reason):
        """A skipped result: the check does not apply, ``reason`` says why."""
        return cls(name, None, message=reason)

    @classmethod
    def undecided(cls, name, reason, to_pass, value=None, threshold=""):
        """An inconclusive result: the check applies, the data given cannot decide it; ``reason`` says why and
        ``to_pass`` what to pass so that it can."""
        return cls(name, None, value, threshold, f"inconclusive: {reason}", to_pass, inconclusive=True)

    @property
    def status(self):
        """``"passed"``, ``"failed"``, ``"skipped"`` or ``"inconclusive"``."""
        if self.passed is None:
            return INCONCLUSIVE if self.inconclusive else SKIPPED
        return PASSED if self.passed else FAILED

    def __str__(self):
        value = "" if self.value is None else _number(self.value)
        line = f"{_LABEL[self.status]}  {self.name:<27} {value:>9} {self.threshold:<9} {self.message}"
        if self.status in (FAILED, INCONCLUSIVE) and self.fix:
            line += f"\n      {'':<27} {'fix' if self.status == FAILED else 'to decide'}: {self.fix}"
        return line.rstrip()


def _number(value):
    if isinstance(value, (int, bool)) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e6):
        return str(int(value))
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3g}"


class Report:
    """All results of one ``checks.run``, in the order they ran.

    ``report[name]`` is one ``CheckResult``; ``report.failed``, ``report.passed``
    and ``report.skipped`` are lists of names; ``str(report)`` is a table with
    one line per check and the fix under each failure.
    """

    def __init__(self, results, seconds=0.0):
        self.results = {r.name: r for r in results}
        self.seconds = seconds

    def _names(self, status):
        return [name for name, r in self.results.items() if r.status == status]

    @property
    def failed(self):
        """Names of the failed checks."""
        return self._names(FAILED)

    @property
    def passed(self):
        """Names of the passed checks."""
        return self._names(PASSED)

    @property
    def skipped(self):
        """Names of the skipped checks (they did not apply)."""
        return self._names(SKIPPED)

    @property
    def inconclusive(self):
        """Names of the checks the data given could not decide (each says what to pass)."""
        return self._names(INCONCLUSIVE)

    @property
    def ok(self):
        """True when no check failed."""
        return not self.failed

    def __getitem__(self, name):
        try:
            return self.results[name]
        except KeyError:
            raise KeyError(f"no check {name!r} in this report; it has {', '.join(self.results)}") from None

    def __contains__(self, name):
        return name in self.results

    def __iter__(self):
        return iter(self.results.values())

    def __len__(self):
        return len(self.results)

    def __str__(self):
        head = (f"pre-flight checks: {len(self.passed)} passed, {len(self.failed)} failed, "
                + (f"{len(self.inconclusive)} inconclusive, " if self.inconclusive else "")
                + f"{len(self.skipped)} skipped ({self.seconds:.1f} s)")
        return "\n".join([head] + [str(r) for r in self])

    def __repr__(self):
        return (f"Report(failed={self.failed}, passed={len(self.passed)}, inconclusive={self.inconclusive}, "
                f"skipped={len(self.skipped)})")

    def raise_if_failed(self):
        """Raise one ``AssertionError`` listing every failed check (an explicit raise: ``-O`` keeps it)."""
        if self.failed:
            lines = [f"{len(self.failed)} pre-flight check(s) failed:"]
            for name in self.failed:
                result = self.results[name]
                lines.append(f"- {name}: {result.message}" + (f" Fix: {result.fix}" if result.fix else ""))
            raise AssertionError("\n".join(lines))
        return self
