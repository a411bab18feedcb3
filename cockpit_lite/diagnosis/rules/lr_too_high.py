"""``lr_too_high``: the loss spikes or diverges, or learns and then collapses.

- spike / divergence: the median of the last ``COLLAPSE_WINDOW`` (7) finite losses
  exceeds ``SPIKE`` · L_s (below) after updates of at least ``DIVERGE_RATIO`` of the weights' norm
  (the largest 3-step median so far), unless a logged held-out loss is below its first log
  (mini-batch losses dominated by a few outlier targets are not a divergence), or one
  loss exceeds ``SPIKE_ONE`` times the first right after an update of at least
  ``OVERSHOOT_RATIO`` of the weights' norm (the largest of the 3 before it): after small
  updates a spike is a batch of outliers, or gradients that exploded (``exploding_gradients``);
- collapse: the robust loss level (median of the last ``COLLAPSE_WINDOW`` records, so that
  heavy-tailed mini-batch losses, e.g. a regression with outlier targets, do not move it)
  went below (1 − ``LEARNED``) L₀, then climbs back ``COLLAPSE`` of the way to L₀ for
  ``SUSTAIN`` records; when a held-out loss is logged (``cp.log``'s valid_loss, else
  test_loss) it must have climbed back the same way too (its best against its first log):
  a held-out loss that keeps falling says the training did not collapse;
- updates of ≥ ``HIGH_RATIO`` of the weights' norm per step (median of the last 3) while
  the loss does not improve (3-median ≥ 0.9 L_s);
- overshooting steps: updates of ≥ ``OVERSHOOT_RATIO`` of the weights' norm (a 3-step
  median, at any step so far) and the 3-median loss ≥ ``OVERSHOOT_LOSS`` · L_s (AdamW at a high learning
  rate without warm-up: the loss jumps, then plateaus far above the healthy twin's);
  these two and the divergence compare with L_s, the lower of L₀ and the first loss: L₀, the
  median of the first 3 losses, already holds the rise that the first updates caused when they
  are this large (Adam at 1.0 on a small net: 1.07, then 2.36 and 2.34 after updates of 3.4 and
  0.7 of the weights' norm; timm's EfficientNet-B0 under SGD at 0.05: 6.72, 18.3, 43.6 after
  updates of 0.11 – 0.16);
- a non-finite loss whose origin has non-finite parameters (an update diverged), after a
  finite loss was seen: when the first loss seen is already non-finite (tracking began
  late, e.g. after an overhead budget's untracked first steps), non-finite parameters
  may come from non-finite data at an unseen step, and ``nan_loss`` reports it.

The suggestion quotes how far to lower the rate where the updates say it: by their size over
``HEALTHY_STEP`` (``evidence["lr_divisor"]``, at least 3), else by 3-10x.
"""

import math
import statistics

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, logged, plain
from cockpit_lite.diagnosis.rules.base import Rule

SUGGESTION = "lower the learning rate (by 3-10x), add warm-up, or clip the gradient norm"


class LrTooHigh(Rule):
    KIND = "lr_too_high"
    SIGNALS = ("Loss", "UpdateSize", "ParamNorm", "NonfiniteOrigin")

    def __init__(self):
        self.best = math.inf
        self.collapse = Streak(T.SUSTAIN)
        self.held = None  # (first, best, last) held-out loss, once logged
        self.peak = (0.0, None)  # the largest 3-step median update ratio so far, and where

    def observe(self, step, entry, history):
        ref = history.loss_ref
        origin = entry.get("NonfiniteOrigin")
        seen_finite = history.first_finite_loss is not None and history.first_finite_loss[0] < step
        if isinstance(origin, dict) and origin.get("params_nonfinite") and seen_finite:
            return [self._finding(step, f"the loss became non-finite at step {step} because the parameters of "
                                  f"{origin.get('module')!r} were already non-finite: an update diverged",
                                  {"loss_ref": plain(ref), "module": origin.get("module")})]
        ratio = history.median_recent_ratio(3)
        first = history.first_finite_loss[1] if history.first_finite_loss else math.nan
        start = min(ref, first)  # (a loss that the first, suspect updates already raised does not raise L₀)
        stuck = len(history.losses) >= 4 and history.median_recent_loss(3) >= 0.9 * start
        if len(history.ratios) >= 3 and ratio >= T.HIGH_RATIO and stuck:
            return [self._finding(history.ratios[-3][0], f"each update changes the weights by {fmt(ratio, 2)} of "
                                  f"their norm (median of the 3 steps up to {step}; healthy: ~1e-3 to 1e-2)",
                                  {"update_ratio": plain(ratio), "loss_ref": plain(start)})]
        if len(history.ratios) >= 3 and finite(ratio) and ratio > self.peak[0]:
            self.peak = (ratio, history.ratios[-1][0])
        rose = history.median_recent_loss(3) >= T.OVERSHOOT_LOSS * start if len(history.losses) >= 3 else False
        if self.peak[0] >= T.OVERSHOOT_RATIO and rose:
            peak, at = self.peak
            return [self._finding(step, f"updates changed the weights by {fmt(peak, 2)} of their norm (median of "
                                  f"the 3 steps up to {at}; healthy: ~1e-3 to 1e-2) and the "
                                  f"loss rose from {fmt(start)} to {fmt(history.median_recent_loss(3))} (median of the "
                                  f"3 records up to step {step}): the steps overshoot",
                                  {"update_ratio": plain(peak), "loss_ref": plain(start),
                                   "loss": plain(history.median_recent_loss(3))})]
        last = history.losses[-1][1] if history.losses and history.losses[-1][0] == step else math.nan
        pushed = max((r for _, r in history.ratios[-3:] if finite(r)), default=0.0)  # the updates that led here
        if len(history.losses) >= 2 and first > 0 and last > T.SPIKE_ONE * first and pushed >= T.OVERSHOOT_RATIO:
            return [self._finding(step, f"the loss spiked to {fmt(last)} at step {step}, "
                                  f"{fmt(last / first, 2)}x its first value {fmt(first)}, after an update of "
                                  f"{fmt(pushed, 2)} of the weights' norm",
                                  {"loss_first": plain(first), "loss": plain(last), "ratio": plain(last / first),
                                   "update_ratio": plain(pushed)})]
        held = logged(entry, "valid_loss", "test_loss")
        if held is not None:
            first_held, best_held, _ = self.held or (held, held, held)
            self.held = (first_held, min(best_held, held), held)
        improving = self.held is not None and self.held[2] < self.held[0]  # the held-out loss says it learns
        recent = [v for v in history.recent_losses(T.COLLAPSE_WINDOW) if math.isfinite(v)]
        if len(recent) < T.COLLAPSE_WINDOW or not math.isfinite(ref) or ref <= 0:
            return []
        median = statistics.median(recent)  # of 7 records: a few outlier batches do not move it
        if median > T.SPIKE * start and not improving and self.peak[0] >= T.DIVERGE_RATIO:
            return [self._finding(step, f"the loss rose from {fmt(start)} at the start to {fmt(median)} "
                                  f"(median of the {len(recent)} records up to step {step}), {fmt(median / start, 2)}x "
                                  "its initial value",
                                  {"loss_ref": plain(start), "loss": plain(median), "ratio": plain(median / start)})]
        level = history.median_recent_loss(T.COLLAPSE_WINDOW)
        self.best = min(self.best, level)
        learned = self.best < (1 - T.LEARNED) * ref
        back = level > self.best + T.COLLAPSE * (ref - self.best)
        if self.held is not None:  # the held-out loss must say so too
            first_held, best_held, last_held = self.held
            back = back and best_held < (1 - T.LEARNED) * first_held and \
                last_held > best_held + T.COLLAPSE * (first_held - best_held)
        if self.collapse.see(step, learned and back, level):
            also = (f"; the held-out loss went {fmt(self.held[0])} -> {fmt(self.held[1])} -> {fmt(self.held[2])}"
                    if self.held is not None else "")
            return [self._finding(self.collapse.start,
                                  f"the loss fell from {fmt(ref)} to {fmt(self.best)} (medians of "
                                  f"{T.COLLAPSE_WINDOW} records), then climbed back to {fmt(self.collapse.first)} "
                                  f"by step {self.collapse.start} ({fmt(level)} at step {step}){also}: training "
                                  "collapsed",
                                  {"loss_ref": plain(ref), "best": plain(self.best), "loss": plain(level)})]
        return []

    def _finding(self, step, message, evidence):
        ratio = evidence.get("update_ratio") or self.peak[0]
        if not (finite(ratio) and ratio > T.HEALTHY_STEP):
            return Finding(self.KIND, None, step, "error", message, SUGGESTION, evidence)
        divisor = max(3.0, float(f"{ratio / T.HEALTHY_STEP:.2g}"))  # to the healthy updates' size
        return Finding(self.KIND, None, step, "error", message,
                       f"lower the learning rate by ~{divisor:.0f}x (updates of {fmt(ratio, 2)} of the weights' norm "
                       f"per step; healthy runs take <= {fmt(T.HEALTHY_STEP)}), add warm-up, or clip the gradient norm",
                       {**evidence, "lr_divisor": divisor})
