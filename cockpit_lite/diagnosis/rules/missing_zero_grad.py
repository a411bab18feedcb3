"""``missing_zero_grad``: gradients are non-zero when backward starts although the
optimizer stepped since the previous backward pass, on 2 records."""

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
        before, stepped = value.get("before"), value.get("stepped")
        holds = finite(before) and float(before) > 0 and stepped is not None and stepped >= 1
        if not self.streak.see(step, holds, before):
            return []
        after = value.get("after")
        return [Finding(
            self.KIND, None, self.streak.start, "error",
            f"at step {self.streak.start} the parameters still held gradients (norm {fmt(before)}, this batch's "
            f"own: {fmt(after)}) from batches the optimizer had already stepped on: gradients accumulate",
            "call optimizer.zero_grad() (or model.zero_grad()) before each loss.backward()",
            {"before": plain(before), "after": plain(after), "stepped": stepped},
        )]
