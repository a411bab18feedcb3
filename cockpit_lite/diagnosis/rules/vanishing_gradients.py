"""``vanishing_gradients``: the first weight tensors get (almost) no gradient compared
with the last: r = ‖g‖/‖θ‖ of the first ≤ ``VANISH_RATIO`` · r of the output end,
sustained. Layer: the first (input-side) affected layer."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import fmt, plain
from cockpit_lite.diagnosis.rules.gradient_flow import GradientFlowRule, layer


class VanishingGradients(GradientFlowRule):
    KIND = "vanishing_gradients"
    shrink = 1.0

    def holds(self, entry, ratios, ref, first):
        self.shrink = first / ref if ref > 0 else 1.0
        return ref > 0 and self.shrink <= T.VANISH_RATIO

    def finding(self, history, ratios, ref, first):
        shrink = self.shrink
        affected = [i for i, r in ratios if r <= T.VANISH_RATIO * ref]
        where = layer(history, affected[0])
        return Finding(
            self.KIND, where, self.streak.start, "warning",  # the head still trains: it costs accuracy
            f"{where!r} gets {fmt(shrink, 2)} of the output layers' gradient (relative to its weights) since step "
            f"{self.streak.start}; {len(affected)} of {len(ratios)} weight tensors are below "
            f"{fmt(T.VANISH_RATIO)} of it",
            "use ReLU-family activations instead of sigmoid/tanh, Kaiming initialisation, normalisation layers or "
            "residual connections (and check for a .detach() or no_grad in the forward pass)",
            {"first_to_output": plain(shrink), "affected": len(affected), "weights": len(ratios)},
        )
