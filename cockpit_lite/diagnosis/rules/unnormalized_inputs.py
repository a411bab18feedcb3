"""``unnormalized_inputs``: the model's first input has scale max(|mean|, std) ≥
``INPUT_SCALE`` on 2 records (0..255 images, a huge offset or spread)."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, plain
from cockpit_lite.diagnosis.rules.base import Rule


class UnnormalizedInputs(Rule):
    KIND = "unnormalized_inputs"
    SIGNALS = ("InputStats",)

    def __init__(self):
        self.streak = Streak(2)

    def observe(self, step, entry, history):
        stats = entry.get("InputStats")
        if not isinstance(stats, dict) or not all(finite(stats.get(k)) for k in ("mean", "std")):
            return []
        mean, std = float(stats["mean"]), float(stats["std"])
        if not self.streak.see(step, max(abs(mean), std) >= T.INPUT_SCALE):
            return []
        low, high = stats.get("min"), stats.get("max")
        return [Finding(
            self.KIND, None, self.streak.start, "warning",
            f"the model's inputs have mean {fmt(mean)} and std {fmt(std)} (range {fmt(low)} .. {fmt(high)}) "
            f"since step {self.streak.start}, far from unit scale",
            "standardise the inputs (subtract the training mean, divide by the std; images: divide by 255 first)",
            {"mean": plain(mean), "std": plain(std), "min": plain(low), "max": plain(high)},
        )]
