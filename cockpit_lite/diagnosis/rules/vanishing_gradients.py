"""``vanishing_gradients``: the first weight tensors get (almost) no gradient compared
with the last: r = ‖g‖/‖θ‖ of the first ≤ ``VANISH_RATIO`` · r of the output end,
sustained ``T.SUSTAIN`` records in a row (a record without the relative gradients breaks
the streak); reported once. Layer: the first (input-side) affected layer."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, fmt, plain
from cockpit_lite.diagnosis.rules.base import Rule
from cockpit_lite.diagnosis.rules.gradient_flow import layer, reference


class VanishingGradients(Rule):
    KIND = "vanishing_gradients"
    SIGNALS = ("GradNorm", "ParamNorm")
    shrink = 1.0  # r of the first weight tensor over the output end's, at the last record that had them

    def __init__(self):
        self.streak = Streak(T.SUSTAIN)
        self.done = False

    def observe(self, step, entry, history):
        ratios = None if self.done else history.relative_gradients(entry)
        if ratios is None:
            self.streak.see(step, False)
            return []
        ref = reference(ratios)
        self.shrink = ratios[0][1] / ref if ref > 0 else 1.0
        if not self.streak.see(step, ref > 0 and self.shrink <= T.VANISH_RATIO):
            return []
        self.done = True
        affected = [i for i, r in ratios if r <= T.VANISH_RATIO * ref]
        where = layer(history, affected[0])
        return [Finding(
            self.KIND, where, self.streak.start, "warning",  # the head still trains: it costs accuracy
            f"{where!r} gets {fmt(self.shrink, 2)} of the output layers' gradient (relative to its weights) since "
            f"step {self.streak.start}; {len(affected)} of {len(ratios)} weight tensors are below "
            f"{fmt(T.VANISH_RATIO)} of it",
            "use ReLU-family activations instead of sigmoid/tanh, Kaiming initialisation, normalisation layers or "
            "residual connections (and check for a .detach() or no_grad in the forward pass)",
            {"first_to_output": plain(self.shrink), "affected": len(affected), "weights": len(ratios)},
        )]
