"""``exploding_gradients``: relative gradients ‖g‖/‖θ‖ far larger at the input end than
at the output end (ratio ≥ ``EXPLODE_RATIO``), or the total gradient norm grown to
``EXPLODE_GROWTH`` times its value at the first step, sustained. Layer: where r is largest."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, plain, rss
from cockpit_lite.diagnosis.rules.base import Rule
from cockpit_lite.diagnosis.rules.gradient_flow import layer, reference


class ExplodingGradients(Rule):
    KIND = "exploding_gradients"
    SIGNALS = ("GradNorm", "ParamNorm")

    def __init__(self):
        self.streak = Streak(T.SUSTAIN)
        self.done = False
        self.initial = None

    def observe(self, step, entry, history):
        ratios = None if self.done else history.relative_gradients(entry)
        if ratios is None:
            self.streak.see(step, False)
            return []
        ref = reference(ratios)
        first = ratios[0][1]
        norm = rss(entry["GradNorm"])
        if self.initial is None and finite(norm) and norm > 0:
            self.initial = norm
        grown = norm / self.initial if self.initial else 1.0
        growth = first / ref if ref > 0 else 0.0  # no gradient at the output end: blocked, not exploding
        holds = growth >= T.EXPLODE_RATIO or (finite(grown) and grown >= T.EXPLODE_GROWTH)
        if not self.streak.see(step, holds):
            return []
        self.done = True
        index, largest = max(ratios, key=lambda item: item[1])
        where = layer(history, index)
        return [Finding(
            self.KIND, where, self.streak.start, "error",
            f"the gradient norm is {fmt(grown, 2)}x its value at the first step, and {fmt(growth, 2)}x larger "
            f"(relative to the weights) at the input end than at the output; largest in {where!r} "
            f"(||g||/||w|| = {fmt(largest, 2)}) since step {self.streak.start}",
            "use a variance-preserving initialisation (Kaiming/Xavier), add normalisation layers or residual "
            "connections, or clip the gradient norm",
            {"growth": plain(grown), "input_to_output": plain(growth), "largest": plain(largest)},
        )]
