"""``overfitting``: the held-out loss (``cp.log``'s valid_loss, else test_loss; a stored ``None`` is skipped) rises
``OVERFIT_RISE`` above its minimum while the training loss (train_loss, else the
mini-batch loss) fell ``OVERFIT_FALL`` since that minimum, on 2 logs."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, logged, plain
from cockpit_lite.diagnosis.rules.base import Rule


class Overfitting(Rule):
    KIND = "overfitting"
    SIGNALS = ("valid_loss", "test_loss", "train_loss", "Loss")

    def __init__(self):
        self.best = None  # (held-out loss, train loss, step)
        self.streak = Streak(2)

    def observe(self, step, entry, history):
        held = logged(entry, "valid_loss", "test_loss")
        train = logged(entry, "train_loss")
        if train is None and "Loss" in entry:
            train = history.median_recent_loss(5)
        if not (finite(held) and finite(train)):
            return []
        held, train = float(held), float(train)
        if self.best is None or held < self.best[0]:
            self.best = (held, train, step)
        best, train_then, at = self.best
        holds = held >= (1 + T.OVERFIT_RISE) * best and train <= (1 - T.OVERFIT_FALL) * train_then
        if not self.streak.see(step, holds):
            return []
        return [Finding(
            self.KIND, None, self.streak.start, "warning",
            f"the held-out loss rose from {fmt(best)} (step {at}) to {fmt(held)} at step {step} while the training "
            f"loss fell from {fmt(train_then)} to {fmt(train)}: the model memorises the training set",
            "stop early (keep the checkpoint of the held-out minimum), add weight decay / dropout / augmentation, "
            "or get more data",
            {"held_out_min": plain(best), "held_out": plain(held), "train_then": plain(train_then),
             "train": plain(train)},
        )]
