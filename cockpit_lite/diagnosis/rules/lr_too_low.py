"""``lr_too_low``: the steps are too small for the loss to move.

- from the start: after ``MIN_STEPS`` records, while the learning rate is not rising (a
  warm-up is small on purpose), the loss has barely moved (by less than ``LOW_DROP`` of L₀
  either way: a loss that got much *worse* than at the start is not a too small step), the
  updates are tiny against the weights (median ‖Δθ‖/‖θ‖ of the last 5 records <
  ``LOW_RATIO``), and every layer gets a gradient (so it is not a vanishing gradient);
- late: the learning rate (``GradPresence.lr``, else the logged ``learning_rate``) fell to
  ≤ 1/``LATE_COLLAPSE`` of its peak at record S, and the updates since S (median ‖Δθ‖/‖θ‖)
  are ≤ 1/``LATE_COLLAPSE`` of their largest 3-record median before it, with one of

  - *a collapse in one step*: the lr fell ≥ ``LATE_COLLAPSE``-fold between the record before
    S and S (a milestone with gamma 1e-4, an epoch horizon reached); found on the second
    record from S on;
  - *step decays too close together*: the lr fell ≥ ``LATE_STEP``-fold into S, and the step
    decay before it came at P with S − P ≤ ``CLOSE_STEPS`` · P (per-epoch milestones stepped
    every batch: 30 and 40; a healthy staircase waits for the loss to settle, 40 and 80);
    found on the second record from S on;
  - *a smooth decay to almost nothing*: the lr decreased on each of the 5 records up to S
    (exponential, cosine with a horizon given in epochs) and the run has gone on at tiny
    updates for ``STALL_SHARE`` · S steps since: a healthy cosine, linear or OneCycle schedule
    reaches 1/30 of its peak only in its last ~12 % of steps and ends there.

  A rate that rises above 1/``LATE_COLLAPSE`` of its peak again (a warm restart) starts over.
  A staircase of decays far apart (StepLR 0.1 at 40, 80, 120) is a healthy schedule and is
  not flagged, even where its last steps barely move the loss.
"""

import math
import statistics

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import fmt, learning_rate, plain
from cockpit_lite.diagnosis.rules.base import Rule

SUGGESTION = "raise the learning rate (by about 10x; a healthy update is ~1e-3 of the weights per step)"
SCHEDULE = ("check the learning-rate schedule: a per-epoch scheduler (MultiStepLR, StepLR, ExponentialLR, a cosine "
            "horizon in epochs) stepped every batch collapses the rate, and a gamma of 1e-4 is 1000x more than one "
            "decay; ")
SMOOTH = 5
"""Records of steady decrease that make a decay smooth."""


class LrTooLow(Rule):
    KIND = "lr_too_low"
    SIGNALS = ("Loss", "UpdateSize", "ParamNorm", "GradNorm", "GradPresence", "learning_rate")
    peak = None
    """The largest lr of ``lrs`` (kept as they come; a state saved without it finds it from ``lrs`` once)."""

    def __init__(self):
        self.lrs = []         # (step, lr) of the records that have one
        self.drops = []       # steps of the step decays (>= LATE_STEP x between records)
        self.low = None       # (S, how, lr before S, lr at S) once the lr is <= peak / LATE_COLLAPSE

    def observe(self, step, entry, history):
        lr = learning_rate(entry)
        if lr is not None and (not self.lrs or self.lrs[-1][0] != step):
            self._see_lr(step, lr)
        grads = entry.get("GradNorm")
        if not hasattr(grads, "__len__") or len(history.losses) < T.MIN_STEPS \
                or len(history.ratios) < T.MIN_STEPS - 1:
            return []
        if not all(math.isfinite(float(g)) and float(g) > 0 for g in grads):
            return []  # a layer without gradient: vanishing_gradients / a frozen layer, not the step size
        return self._start(step, history) or self._late(step, history)

    def _start(self, step, history):
        ref, now, ratio = history.loss_ref, history.median_recent_loss(5), history.median_recent_ratio(5)
        warming = len(self.lrs) >= 2 and self.lrs[-1][1] > self.lrs[-2][1]
        if warming or not (math.isfinite(ref) and ref > 0 and math.isfinite(now) and math.isfinite(ratio)):
            return []
        drop = (ref - now) / ref
        if abs(drop) >= T.LOW_DROP or ratio >= T.LOW_RATIO:
            return []
        return [Finding(
            self.KIND, None, step, "warning",
            f"after {len(history.losses)} records (step {step}) the loss moved only {fmt(100 * abs(drop), 2)}% "
            f"({fmt(ref)} -> {fmt(now)}, medians) while each step changed the weights by {fmt(ratio, 2)} of "
            "their norm, although every layer gets a gradient",
            SUGGESTION, {"loss_ref": plain(ref), "loss": plain(now), "update_ratio": plain(ratio)},
        )]

    def _see_lr(self, step, lr):
        before = self.lrs[-1][1] if self.lrs else None
        self.lrs.append((step, lr))
        self.peak = max(v for _, v in self.lrs) if self.peak is None else max(self.peak, lr)
        peak = self.peak
        if before is not None and before > 0 and (lr <= 0 or before >= T.LATE_STEP * lr):
            self.drops.append(step)
        if lr > peak / T.LATE_COLLAPSE:
            self.low = None  # (again) above the collapse: a warm restart starts over
            return
        if self.low is not None or before is None:
            return
        earlier = [v for _, v in self.lrs[-SMOOTH - 1:]]
        if before > 0 and (lr <= 0 or before >= T.LATE_COLLAPSE * lr):
            how = "in one step"
        elif self.drops and self.drops[-1] == step and len(self.drops) >= 2 \
                and step - self.drops[-2] <= T.CLOSE_STEPS * self.drops[-2]:
            how = f"in step decays at steps {self.drops[-2]} and {step}"
        elif len(earlier) > SMOOTH and all(a > b for a, b in zip(earlier, earlier[1:])):
            how = "smoothly"
        else:
            how = None  # a staircase of decays far apart: a healthy schedule
        self.low = (step, how, before, lr)

    def _late(self, step, history):
        if self.low is None or self.low[1] is None:
            return []
        at, how, before, then = self.low
        since = [r for s, r in history.ratios if s >= at and math.isfinite(r)]
        earlier = [r for s, r in history.ratios if s < at and math.isfinite(r)]
        if len(since) < 2 or len(earlier) < 3:
            return []
        if how == "smoothly" and step - at < T.STALL_SHARE * at:
            return []
        ratio = statistics.median(since[-3:])
        usual = max(statistics.median(earlier[i:i + 3]) for i in range(len(earlier) - 2))
        if ratio > usual / T.LATE_COLLAPSE:
            return []
        self.low = (at, None, before, then)  # reported (once per kind anyway)
        peak = max(v for _, v in self.lrs)
        lr = self.lrs[-1][1]
        return [Finding(
            self.KIND, None, at, "warning",
            f"at step {at} the learning rate had fallen {how} to {fmt(then)} (from {fmt(before)} on "
            f"the record before; {fmt(peak / max(lr, 1e-300), 2)}x below its peak {fmt(peak)} by step {step}); since "
            f"then each step changes the weights by {fmt(ratio, 2)} of their norm, {fmt(usual / max(ratio, 1e-300), 2)}x "
            "less than before: training has all but stopped",
            SCHEDULE + SUGGESTION,
            {"lr_peak": plain(peak), "lr": plain(lr), "update_ratio": plain(ratio),
             "update_ratio_before": plain(usual), "how": how},
        )]
