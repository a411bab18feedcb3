"""``unnormalized_inputs``: the model's first input has scale max(|mean|, std) ≥
``INPUT_SCALE`` on 2 records (0..255 images, a huge offset or spread).

When the first layer that receives the input normalises it (``ActivationStats``'
``meta.input_layer`` is a BatchNorm/LayerNorm/GroupNorm/InstanceNorm), the scale is
removed before any weight sees it: the finding is an ``info`` note, not a warning.
"""

from cockpit_lite import log as _log
from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, plain
from cockpit_lite.diagnosis.rules.base import Rule

NORMALISING = ("BatchNorm", "SyncBatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm")
"""Class-name prefixes of layers that remove their input's offset and scale."""


def input_layer(entry):
    """``{"name", "type"}`` of the first layer receiving the input, or ``None``."""
    meta = (entry.get(_log.META) or {}).get("ActivationStats")
    layer = meta.get("input_layer") if isinstance(meta, dict) else None
    return layer if isinstance(layer, dict) else None


class UnnormalizedInputs(Rule):
    KIND = "unnormalized_inputs"
    SIGNALS = ("InputStats", "ActivationStats")

    def __init__(self):
        self.streak = Streak(2)
        self.first = None

    def observe(self, step, entry, history):
        self.first = input_layer(entry) or self.first
        stats = entry.get("InputStats")
        if not isinstance(stats, dict) or not all(finite(stats.get(k)) for k in ("mean", "std")):
            return []
        mean, std = float(stats["mean"]), float(stats["std"])
        if not self.streak.see(step, max(abs(mean), std) >= T.INPUT_SCALE, stats):
            return []
        # the numbers of the streak's first record: the step the finding names, its only step number
        start, stats = self.streak.start, self.streak.first
        mean, std, low, high = float(stats["mean"]), float(stats["std"]), stats.get("min"), stats.get("max")
        evidence = {"mean": plain(mean), "std": plain(std), "min": plain(low), "max": plain(high),
                    "input_layer": self.first}
        seen = (f"the model's inputs have mean {fmt(mean)} and std {fmt(std)} (range {fmt(low)} .. {fmt(high)}) "
                f"at step {start}")
        kind = str((self.first or {}).get("type", ""))
        if kind.startswith(NORMALISING):
            return [Finding(
                self.KIND, None, self.streak.start, "info",
                f"{seen}, far from unit scale; the first layer {self.first.get('name')!r} ({kind}) normalises "
                "them, so this costs nothing",
                "none needed; standardising the inputs would still make the layer's running statistics easier "
                "to read",
                evidence,
            )]
        return [Finding(
            self.KIND, None, self.streak.start, "warning", f"{seen}, far from unit scale",
            "standardise the inputs (subtract the training mean, divide by the std; images: divide by 255 first)",
            evidence,
        )]
