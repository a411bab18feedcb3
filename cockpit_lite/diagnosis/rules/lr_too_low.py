"""``lr_too_low``: after ``MIN_STEPS`` the loss has barely moved, the updates are tiny
against the weights, and every layer gets a gradient (so it is not a vanishing gradient)."""

import math

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import fmt, plain
from cockpit_lite.diagnosis.rules.base import Rule


class LrTooLow(Rule):
    KIND = "lr_too_low"
    SIGNALS = ("Loss", "UpdateSize", "ParamNorm", "GradNorm")

    def observe(self, step, entry, history):
        if len(history.losses) < T.MIN_STEPS or len(history.ratios) < T.MIN_STEPS - 1:
            return []
        ref = history.loss_ref
        now = history.median_recent_loss(5)
        ratio = history.median_recent_ratio(5)
        if not (math.isfinite(ref) and ref > 0 and math.isfinite(now) and math.isfinite(ratio)):
            return []
        grads = entry.get("GradNorm")
        if not isinstance(grads, (list, tuple)) and not hasattr(grads, "__len__"):
            return []
        reach = all(math.isfinite(float(g)) and float(g) > 0 for g in grads)
        drop = (ref - now) / ref
        if drop < T.LOW_DROP and ratio < T.LOW_RATIO and reach:
            return [Finding(
                self.KIND, None, step, "warning",
                f"after {len(history.losses)} steps the loss moved only {fmt(100 * drop, 2)}% "
                f"({fmt(ref)} -> {fmt(now)}) while each step changed the weights by {fmt(ratio, 2)} of "
                "their norm, although every layer gets a gradient",
                "raise the learning rate (by about 10x; a healthy update is ~1e-3 of the weights per step)",
                {"loss_ref": plain(ref), "loss": plain(now), "update_ratio": plain(ratio)},
            )]
        return []
