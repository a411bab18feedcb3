"""Shared by ``dead_relu`` and ``saturated_activations``: one statistic of
``ActivationStats`` at or above a threshold in one module, sustained."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, plain
from cockpit_lite.diagnosis.rules.base import Rule


class ActivationRule(Rule):
    """Subclasses set ``KIND``, ``FIELD``, ``THRESHOLD`` and ``describe``."""

    SIGNALS = ("ActivationStats",)
    FIELD = None
    THRESHOLD = None
    SUGGESTION = None

    def __init__(self):
        self.streaks = {}

    def observe(self, step, entry, history):
        stats = entry.get("ActivationStats")
        if not isinstance(stats, dict):
            return []
        found = []
        for module, values in stats.items():
            value = values.get(self.FIELD) if isinstance(values, dict) else None
            if value is None or not finite(value):
                continue
            streak = self.streaks.setdefault(module, Streak(T.SUSTAIN))
            if streak.see(step, value >= self.THRESHOLD, value):
                found.append(Finding(
                    self.KIND, module, streak.start, "error" if value >= 0.9 else "warning",
                    self.describe(module, values.get("type"), streak.first, streak.start),  # the named step's
                    self.SUGGESTION, {self.FIELD: plain(value), "first": plain(streak.first),
                                      "type": values.get("type")},
                ))
        return found

    def describe(self, module, type_name, value, start):
        raise NotImplementedError
