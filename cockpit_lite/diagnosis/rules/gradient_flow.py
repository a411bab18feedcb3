"""Shared by ``exploding_gradients`` and ``vanishing_gradients``: per weight tensor the
relative gradient r = ‖g‖/‖θ‖, in parameter (≈ forward) order, compared between the
input end (the first weight tensor) and the output end (``reference``)."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.history import Streak, module_of
from cockpit_lite.diagnosis.rules.base import Rule


def layer(history, index):
    return module_of(history.name(index))


def reference(ratios):
    """max r over the last two weight tensors (the output end)."""
    return max(r for _, r in ratios[-2:])


class GradientFlowRule(Rule):
    """A condition on the relative gradients that must hold ``T.SUSTAIN`` records in a row;
    reported once. Subclasses define ``holds`` and ``finding``."""

    SIGNALS = ("GradNorm", "ParamNorm")

    def __init__(self):
        self.streak = Streak(T.SUSTAIN)
        self.done = False

    def observe(self, step, entry, history):
        ratios = None if self.done else history.relative_gradients(entry)
        if ratios is None:
            self.streak.see(step, False)
            return []
        ref, first = reference(ratios), ratios[0][1]
        if not self.streak.see(step, self.holds(entry, ratios, ref, first)):
            return []
        self.done = True
        return [self.finding(history, ratios, ref, first)]

    def holds(self, entry, ratios, ref, first):
        """Whether the condition holds at this record."""
        raise NotImplementedError

    def finding(self, history, ratios, ref, first):
        """The ``Finding`` once the condition held long enough (``self.streak.start``: since when)."""
        raise NotImplementedError
