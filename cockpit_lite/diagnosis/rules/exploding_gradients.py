"""``exploding_gradients``: relative gradients ‖g‖/‖θ‖ far larger at the input end than
at the output end (ratio ≥ ``EXPLODE_RATIO``), or the total gradient norm grown to
``EXPLODE_GROWTH`` times its value at the first step, sustained. Layer: where r is largest."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import finite, fmt, plain, rss
from cockpit_lite.diagnosis.rules.gradient_flow import GradientFlowRule, layer


class ExplodingGradients(GradientFlowRule):
    KIND = "exploding_gradients"

    def __init__(self):
        super().__init__()
        self.initial = None
        self.grown = self.growth = 1.0

    def holds(self, entry, ratios, ref, first):
        norm = rss(entry["GradNorm"])
        if self.initial is None and finite(norm) and norm > 0:
            self.initial = norm
        self.grown = norm / self.initial if self.initial else 1.0
        self.growth = first / ref if ref > 0 else 0.0  # no gradient at the output end: blocked, not exploding
        return self.growth >= T.EXPLODE_RATIO or (finite(self.grown) and self.grown >= T.EXPLODE_GROWTH)

    def finding(self, history, ratios, ref, first):
        grown, growth = self.grown, self.growth
        index, largest = max(ratios, key=lambda item: item[1])
        where = layer(history, index)
        return Finding(
            self.KIND, where, self.streak.start, "error",
            f"the gradient norm is {fmt(grown, 2)}x its value at the first step, and {fmt(growth, 2)}x larger "
            f"(relative to the weights) at the input end than at the output; largest in {where!r} "
            f"(||g||/||w|| = {fmt(largest, 2)}) since step {self.streak.start}",
            "use a variance-preserving initialisation (Kaiming/Xavier), add normalisation layers or residual "
            "connections, or clip the gradient norm",
            {"growth": plain(grown), "input_to_output": plain(growth), "largest": plain(largest)},
        )
