"""``lr_too_high`` on a non-finite loss whose parameters are non-finite: a diverged update only
after a finite loss was seen."""

import math

from cockpit_lite.diagnosis.history import History
from cockpit_lite.diagnosis.rules.lr_too_high import LrTooHigh

ORIGIN = {"module": "0", "op": "AddmmBackward0", "params_nonfinite": True}


def _findings(entries):
    history, rule, found = History(), LrTooHigh(), []
    for step, entry in entries:
        history.update(step, entry)
        found += rule.observe(step, entry, history)
    return found


def test_non_finite_parameters_after_a_finite_loss_are_a_diverged_update():
    found = _findings([(0, {"Loss": 2.3}), (1, {"Loss": math.nan, "NonfiniteOrigin": ORIGIN})])
    assert [(f.kind, f.step) for f in found] == [("lr_too_high", 1)]
    assert "an update diverged" in found[0].message


def test_non_finite_parameters_at_the_first_loss_seen_are_not_blamed_on_the_learning_rate():
    # tracking began at step 3 (a budget's untracked first steps): non-finite data at step 0
    # may have written NaN into the parameters; nothing says an update diverged
    assert _findings([(3, {"Loss": math.nan, "NonfiniteOrigin": ORIGIN}), (6, {"Loss": math.nan})]) == []
