"""``overfitting``: the held-out loss rises, beyond its own noise, while the training loss falls
far below it.

The held-out loss is ``cp.log``'s valid_loss, else test_loss (a stored ``None`` is skipped);
the training loss is its train_loss, else the median of the last 5 mini-batch losses. Both
are read as *levels*, medians of their last ``OVERFIT_WINDOW`` logs, so that one noisy
evaluation moves nothing. At a log, overfitting holds when

- the held-out level is ≥ (1 + ``OVERFIT_RISE``) × its lowest level so far (the best: a
  level, not the lowest single log, which is low by its noise), and above it by
  ≥ ``OVERFIT_Z`` σ, σ the held-out loss's noise between consecutive logs (1.4826 × the
  median |difference| of its last ``OVERFIT_NOISE`` logs / √2): a rise, not scatter;
- the training level fell by ≥ ``OVERFIT_FALL`` since the best held-out level;
- the held-out level is ≥ ``OVERFIT_GAP`` × the training level: the model fits its training
  data much better than data it has not seen (memorisation). A healthy run's held-out loss
  rises for a while too (a warm restart, BatchNorm's running statistics, an overconfident
  phase), close to its training loss.

The finding names the step of the best held-out level, where to stop.
"""

import math
import statistics

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import finite, fmt, logged, plain
from cockpit_lite.diagnosis.rules.base import Rule


class Overfitting(Rule):
    KIND = "overfitting"
    SIGNALS = ("valid_loss", "test_loss", "train_loss", "Loss")

    def __init__(self):
        self.logs = []   # (step, held-out loss, training loss)
        self.best = None  # (held-out level, training level, step) of the lowest held-out level

    def observe(self, step, entry, history):
        held = logged(entry, "valid_loss", "test_loss")
        train = logged(entry, "train_loss")
        if train is None and "Loss" in entry:
            train = history.median_recent_loss(5)
        if not (finite(held) and finite(train)):
            return []
        self.logs.append((step, float(held), float(train)))
        if len(self.logs) < T.OVERFIT_WINDOW:
            return []
        recent = self.logs[-T.OVERFIT_WINDOW:]
        level = statistics.median(h for _, h, _ in recent)
        train_level = statistics.median(t for _, _, t in recent)
        if self.best is None or level < self.best[0]:
            self.best = (level, train_level, step)
        best, train_then, at = self.best
        window = self.logs[-T.OVERFIT_NOISE - 1:]
        changes = [abs(b[1] - a[1]) for a, b in zip(window, window[1:])]
        noise = 1.4826 * statistics.median(changes) / math.sqrt(2)
        if not (level >= (1 + T.OVERFIT_RISE) * best and level - best >= T.OVERFIT_Z * noise
                and train_level <= (1 - T.OVERFIT_FALL) * train_then and level >= T.OVERFIT_GAP * train_level):
            return []
        return [Finding(
            self.KIND, None, at, "warning",
            f"the held-out loss rose from {fmt(best)} (step {at}) to {fmt(level)} at step {step} (medians of "
            f"{T.OVERFIT_WINDOW} logs; {fmt((level - best) / max(noise, 1e-300), 2)}x its noise between logs) while "
            f"the training loss fell from {fmt(train_then)} to {fmt(train_level)}, {fmt(level / train_level, 2)}x "
            "below it: the model memorises the training set",
            f"stop early (keep the checkpoint of step {at}, the held-out minimum), add weight decay / dropout / "
            "augmentation, or get more data",
            {"held_out_min": plain(best), "held_out": plain(level), "train_then": plain(train_then),
             "train": plain(train_level), "noise": plain(noise), "step_seen": step},
        )]
