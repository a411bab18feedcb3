"""``lr_too_low``: the steps are too small for the loss to move.

- from the start: after ``MIN_STEPS`` the loss has barely moved (by less than ``LOW_DROP``
  of L₀ either way: a loss that got *worse* than at the start is not a too small step),
  the updates are tiny against the weights (median ‖Δθ‖/‖θ‖ < ``LOW_RATIO``), and every
  layer gets a gradient (so it is not a vanishing gradient);
- late (a learning rate that collapses mid-run, e.g. a per-epoch ``MultiStepLR`` stepped
  every batch): the learning rate (``GradPresence.lr``, else the logged ``learning_rate``)
  fell in a step (at least ``LATE_STEP`` × lower than on the record before, which was not
  the last of 5 records each lower than the one before: a step, not the tail of a smooth
  decay) and is now ≤ 1/``LATE_COLLAPSE`` of its peak, the updates since that record
  (median ‖Δθ‖/‖θ‖) are ≤ 1/``LATE_COLLAPSE`` of their largest 3-record median before it, and the median loss of the (up to 3) last records since the drop, at least 2, is no
  better (by ``LOW_DROP`` of L₀) than the loss at the drop. The tail of a cosine, linear or OneCycle schedule
  decreases on every record and is not flagged.
"""

import math
import statistics

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import finite, fmt, plain
from cockpit_lite.diagnosis.rules.base import Rule

SUGGESTION = "raise the learning rate (by about 10x; a healthy update is ~1e-3 of the weights per step)"


def learning_rate(entry):
    presence = entry.get("GradPresence")
    if isinstance(presence, dict) and finite(presence.get("lr")):
        return float(presence["lr"])
    return float(entry["learning_rate"]) if finite(entry.get("learning_rate")) else None


class LrTooLow(Rule):
    KIND = "lr_too_low"
    SIGNALS = ("Loss", "UpdateSize", "ParamNorm", "GradNorm", "GradPresence", "learning_rate")

    def __init__(self):
        self.lrs = []      # (step, lr) of the records that have one
        self.drop = None   # (step, lr before, lr after) of the last step drop

    def observe(self, step, entry, history):
        lr = learning_rate(entry)
        if lr is not None and (not self.lrs or self.lrs[-1][0] != step):
            self._see_lr(step, lr, history)
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
        if abs(drop) < T.LOW_DROP and ratio < T.LOW_RATIO and reach:
            return [Finding(
                self.KIND, None, step, "warning",
                f"after {len(history.losses)} records (step {step}) the loss moved only {fmt(100 * abs(drop), 2)}% "
                f"({fmt(ref)} -> {fmt(now)}, medians) while each step changed the weights by {fmt(ratio, 2)} of "
                "their norm, although every layer gets a gradient",
                SUGGESTION, {"loss_ref": plain(ref), "loss": plain(now), "update_ratio": plain(ratio)},
            )]
        return self._late(step, history, ref, reach)

    def _see_lr(self, step, lr, history):
        self.lrs.append((step, lr))
        if len(self.lrs) < 2:
            return
        before = self.lrs[-2][1]
        if not (before > 0 and (lr <= 0 or before >= T.LATE_STEP * lr)):
            return
        earlier = [v for _, v in self.lrs[-6:-1]]
        smooth = len(earlier) >= 5 and all(a > b * 1.001 for a, b in zip(earlier, earlier[1:]))
        if not smooth:  # a step (piecewise-constant schedule), not the tail of a smooth decay
            self.drop = (step, before, lr)

    def _late(self, step, history, ref, reach):
        if self.drop is None or not reach:
            return []
        at, before, after = self.drop
        peak = max(lr for _, lr in self.lrs)
        lr = self.lrs[-1][1]
        recent = [r for s, r in history.ratios if s >= at]
        if not recent or lr > peak / T.LATE_COLLAPSE:
            return []
        ratio = statistics.median(recent[-3:])
        earlier = [r for s, r in history.ratios if s < at and math.isfinite(r)]
        usual = max((statistics.median(earlier[i:i + 3]) for i in range(max(1, len(earlier) - 2))), default=math.nan)
        since = [v for s, v in history.losses if s >= at and math.isfinite(v)]
        loss_then = since[0] if since else math.nan
        loss = statistics.median(since[-3:]) if len(since) >= 2 else math.nan
        if not (finite(usual) and ratio <= usual / T.LATE_COLLAPSE and finite(loss)
                and finite(loss_then) and loss >= loss_then - T.LOW_DROP * ref):
            return []
        self.drop = None  # reported (once per kind anyway)
        return [Finding(
            self.KIND, None, at, "warning",
            f"at step {at} the learning rate fell in a step from {fmt(before)} to {fmt(after)} ({fmt(peak / max(lr, 1e-300), 2)}x "
            f"below its peak {fmt(peak)} by step {step}); since then each step changes the weights by "
            f"{fmt(ratio, 2)} of their norm ({fmt(usual / ratio, 2)}x less than before) and the loss stalled ({fmt(loss_then)} "
            f"at step {at}, median {fmt(loss)} of the records since, up to step {step})",
            "check the learning-rate schedule: a per-epoch scheduler (MultiStepLR, StepLR) stepped every batch "
            "collapses the rate; " + SUGGESTION,
            {"lr_peak": plain(peak), "lr": plain(lr), "update_ratio": plain(ratio), "loss_then": plain(loss_then),
             "update_ratio_before": plain(usual), "loss": plain(loss)},
        )]
