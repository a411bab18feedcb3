"""``shuffled_labels``: held-out accuracy stays at chance (≤ ``CHANCE_FACTOR``/C, at most half
way from 1/C to 100 %, C = round(exp L₀)) on ``SUSTAIN`` (3) logs after ``MIN_STEPS`` (on 2, a ViT memorising noisy labels
was called shuffled while it sat at chance for its first 30 steps), while the updates are
not too small, the loss is not diverging and the training loss has not learned either (the
median of its last 3 records ≥ ``CHANCE_LOSS`` L₀: a training loss that falls while the
held-out accuracy stays at chance is a gap between training and evaluation, e.g. BatchNorm's
running statistics lagging early in a fast schedule; and a C read wrong from a scaled loss,
loss / 4 under gradient accumulation, cannot make a learning run look shuffled): there is
nothing in the inputs that predicts the labels. Not while the gradient does not reach the
input end (the latest relative gradients of the first weight tensor ≤ ``VANISH_RATIO`` of
the output end's, ``vanishing_gradients``): a network whose first layers do not learn is at
chance for that reason; nor while the activations shrink through the layers (the last
unbounded activation module's RMS ≤ 1/``ACT_GAIN`` of the first's, ``history.forward_gain``):
the outputs then barely depend on the input, and a deep net initialised so sits at chance on
a plateau before it learns."""

import math

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, forward_gain, logged, plain
from cockpit_lite.diagnosis.rules.base import Rule
from cockpit_lite.diagnosis.rules.gradient_flow import reference


class ShuffledLabels(Rule):
    KIND = "shuffled_labels"
    SIGNALS = ("valid_accuracy", "test_accuracy", "Loss", "UpdateSize", "ParamNorm", "GradNorm")

    def __init__(self):
        self.streak = Streak(T.SUSTAIN)
        self.flowing = True  # whether the gradient reached the input end at the latest step that says
        self.fading = False  # whether the activations shrank through the layers at the latest step that says

    def observe(self, step, entry, history):
        ratios = history.relative_gradients(entry)
        if ratios is not None:
            self.flowing = ratios[0][1] > T.VANISH_RATIO * reference(ratios)
        gain = forward_gain(entry)
        if gain is not None:
            total = gain[1][-1][1] / gain[1][0][1]
            self.fading = total <= 1 / T.ACT_GAIN
        accuracy = logged(entry, "valid_accuracy", "test_accuracy")  # a stored None is skipped
        if accuracy is None:
            return []
        ref = history.loss_ref
        if len(history.losses) < T.MIN_STEPS or not finite(ref) or ref <= 0:
            self.streak.see(step, False)
            return []
        classes = max(2, round(math.exp(min(ref, 20.0))))
        chance = 1.0 / classes
        loss = history.median_recent_loss(5)
        learned = history.median_recent_loss(3) < T.CHANCE_LOSS * ref  # the training loss fell: it learns something
        ratio = history.median_recent_ratio(5)
        moving = not finite(ratio) or ratio >= T.LOW_RATIO
        bound = min(T.CHANCE_FACTOR * chance, (1 + chance) / 2)  # two classes: half way to 100 %
        holds = (float(accuracy) <= bound and moving and loss <= 1.1 * ref and not learned and self.flowing
                 and not self.fading)
        if not self.streak.see(step, holds):
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
