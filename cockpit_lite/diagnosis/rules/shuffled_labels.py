"""``shuffled_labels``: held-out accuracy stays at chance (≤ ``CHANCE_FACTOR``/C, C =
round(exp L₀)) on 2 logs after ``MIN_STEPS``, while the updates are not too small and
the loss is not diverging, and the accuracy has not risen above ``CHANCE_FACTOR`` times its
first logged value: there is nothing in the inputs that predicts the labels. Not while the
gradient does not reach the input end (the latest relative gradients of the first weight
tensor ≤ ``VANISH_RATIO`` of the output end's, ``vanishing_gradients``): a network whose
first layers do not learn is at chance for that reason."""

import math

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, logged, plain
from cockpit_lite.diagnosis.rules.base import Rule
from cockpit_lite.diagnosis.rules.gradient_flow import reference


class ShuffledLabels(Rule):
    KIND = "shuffled_labels"
    SIGNALS = ("valid_accuracy", "test_accuracy", "Loss", "UpdateSize", "ParamNorm", "GradNorm")

    def __init__(self):
        self.streak = Streak(2)
        self.first = None  # the first held-out accuracy logged
        self.flowing = True  # whether the gradient reached the input end at the latest step that says

    def observe(self, step, entry, history):
        ratios = history.relative_gradients(entry)
        if ratios is not None:
            self.flowing = ratios[0][1] > T.VANISH_RATIO * reference(ratios)
        accuracy = logged(entry, "valid_accuracy", "test_accuracy")  # a stored None is skipped
        if accuracy is None:
            return []
        if self.first is None and len(history.losses) < T.MIN_STEPS:
            self.first = float(accuracy)
        ref = history.loss_ref
        if len(history.losses) < T.MIN_STEPS or not finite(ref) or ref <= 0:
            self.streak.see(step, False)
            return []
        classes = max(2, round(math.exp(min(ref, 20.0))))
        chance = 1.0 / classes
        loss = history.median_recent_loss(5)
        ratio = history.median_recent_ratio(5)
        moving = not finite(ratio) or ratio >= T.LOW_RATIO
        if self.first is None:
            self.first = float(accuracy)
        # and not lifted above where it started: C from exp(L0) is wrong when the loss is scaled (loss / k
        # under gradient accumulation), a held-out accuracy that rose is learning whatever C is
        lifted = float(accuracy) > T.CHANCE_FACTOR * max(self.first, 1e-3)
        holds = (float(accuracy) <= T.CHANCE_FACTOR * chance and not lifted and moving and loss <= 1.1 * ref
                 and self.flowing)
        if not self.streak.see(step, holds, float(accuracy)):
            return []
        return [Finding(
            self.KIND, None, self.streak.start, "error",
            f"held-out accuracy is {fmt(100 * float(accuracy), 3)}% at step {step} (chance for ~{classes} classes: "
            f"{fmt(100 * chance, 3)}%) while training moves the weights and the loss goes "
            f"{fmt(ref)} -> {fmt(loss)}: the labels look independent of the inputs",
            "check that inputs and labels are shuffled together (same permutation / same dataset index) and that "
            "the label column is the right one",
            {"accuracy": plain(accuracy), "chance": plain(chance), "classes": classes, "loss": plain(loss)},
        )]
