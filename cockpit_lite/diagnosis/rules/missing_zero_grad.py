"""``missing_zero_grad``: the first backward pass after an optimizer step adds to gradients the
parameters still hold from batches that update already used, on 2 records.

Decided from what is true at the step (``GradPresence.first_backward``): were gradients
present when the first micro-batch's backward pass of this optimizer step reached the
parameters? Gradients present in ``cp(step)`` alone (``before``) say nothing: deliberate
accumulation holds the earlier micro-batches' gradients there, and the previous window's
update happened in between. Logs written before ``first_backward`` existed fall back on
``before > 0`` with an optimizer step since the previous context (which cannot tell
accumulation from the bug).
"""

from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, plain
from cockpit_lite.diagnosis.rules.base import Rule


class MissingZeroGrad(Rule):
    KIND = "missing_zero_grad"
    SIGNALS = ("GradPresence",)

    def __init__(self):
        self.streak = Streak(2)

    def observe(self, step, entry, history):
        value = entry.get("GradPresence")
        if not isinstance(value, dict):
            return []
        before, stepped, held = value.get("before"), value.get("stepped"), value.get("first_backward")
        if "first_backward" in value:
            holds = finite(held) and float(held) > 0
        else:
            held = before
            holds = finite(before) and float(before) > 0 and stepped is not None and stepped >= 1
        if not self.streak.see(step, holds, held):
            return []
        return [Finding(
            self.KIND, None, self.streak.start, "error",
            f"at step {self.streak.start} the first backward pass after the optimizer's update added to gradients "
            f"the parameters still held (norm {fmt(self.streak.first)}) from batches that update had already used: "
            "gradients accumulate across optimizer steps",
            "call optimizer.zero_grad() (or model.zero_grad()) once per optimizer step, before the first "
            "micro-batch's loss.backward()",
            {"held": plain(self.streak.first), "before": plain(before), "after": plain(value.get("after")),
             "stepped": stepped},
        )]
