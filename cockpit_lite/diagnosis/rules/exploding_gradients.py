"""``exploding_gradients``: gradients orders of magnitude larger than they should be.

Two conditions, either one is enough (reported once):

- *growth*: the total gradient norm ‖g‖ is ≥ ``EXPLODE_GROWTH`` times its early level (the
  median of its first 3 finite records that had not grown so, checked from the second
  record on) on 2 consecutive records, or ≥ ``EXPLODE_SPIKE``
  times on one (an LSTM without clipping goes 0.6 → 15,600 in 3 steps, then NaN). Checked at
  every record of the run, so gradients that start exploding late are found within 2 records;
  a loss that spikes at the same time does not hide it (``lr_too_high`` reports the loss).
  Layer: the parameter whose own norm grew most over its early level (the first, in record
  order, within a factor 2 of the largest growth: a near-tie of floats never decides it).
- *input to output*: relative gradients r = ‖g‖/‖θ‖ (weight tensors, tiny and zero-initialised
  ones left out, see ``History.relative_gradients``) at the input end ≥ ``EXPLODE_RATIO`` times
  those at the output end (max r of the last two), sustained ``SUSTAIN`` records. The input end
  is the *smaller* r of the first two weight tensors, so one odd tensor cannot fire on its own.
  Layer: the first weight tensor whose r (median over the streak) is within a factor 2 of the
  largest.
"""

import math
import statistics

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, module_of, plain, rss
from cockpit_lite.diagnosis.rules.base import Rule

SUGGESTION = ("clip the gradient norm (torch.nn.utils.clip_grad_norm_), use a variance-preserving initialisation "
              "(Kaiming/Xavier), add normalisation layers or residual connections")
EARLY = 3


def robust_argmax(values):
    """Index of the first of ``values`` within a factor 2 of the largest (stable under float noise)."""
    largest = max(values)
    return next(i for i, v in enumerate(values) if v >= 0.5 * largest)


class ExplodingGradients(Rule):
    KIND = "exploding_gradients"
    SIGNALS = ("GradNorm", "ParamNorm")

    def __init__(self):
        self.done = False
        self.early = []          # (total, per-tensor norms) of the first finite records
        self.grown = []          # (step, growth, per-tensor norms) of the current growth streak
        self.streak = Streak(T.SUSTAIN)
        self.relative = []       # (step, growth, ratios) of the current input-to-output streak

    def observe(self, step, entry, history):
        grads = entry.get("GradNorm")
        if self.done or not hasattr(grads, "__len__") or not len(grads):
            return []
        norms = [float(g) for g in grads]
        total = rss(norms)
        found = self._growth(step, total, norms, history)
        if found:
            self.done = True
            return found
        found = self._relative(step, entry, history)
        if found:
            self.done = True
        return found

    # -- the total norm against its early level -------------------------------------------------

    def _growth(self, step, total, norms, history):
        if not (finite(total) and total > 0):
            if self.grown and not finite(total):  # grown, then non-finite: the explosion ran out of range
                return self._report(step, self.grown[-1][1], history, overflow=True)
            self.grown = []
            return []
        if not self.early:
            self.early.append((total, norms))
            return []
        level = statistics.median(t for t, _ in self.early)
        growth = total / level
        if growth < T.EXPLODE_GROWTH:
            self.grown = []
            if len(self.early) < EARLY:
                self.early.append((total, norms))
            return []
        self.grown.append((step, growth, norms))
        if len(self.grown) < 2 and growth < T.EXPLODE_SPIKE:
            return []
        return self._report(step, growth, history)

    def _report(self, step, growth, history, overflow=False):
        level = statistics.median(t for t, _ in self.early)
        norms = self.grown[-1][2]
        start, first_growth, first_norms = self.grown[0]
        per = []
        for i in range(len(norms)):
            before = [n[i] for _, n in self.early if i < len(n) and finite(n[i])]
            base = statistics.median(before) if before else 0.0
            now = statistics.median(n[i] for _, _, n in self.grown if i < len(n) and finite(n[i])) \
                if any(i < len(n) and finite(n[i]) for _, _, n in self.grown) else 0.0
            per.append(now / base if base > 0 else (math.inf if now > 0 else 0.0))
        finite_per = [v if finite(v) else 0.0 for v in per]
        index = robust_argmax(finite_per) if max(finite_per) > 0 else 0
        where = module_of(history.name(index))
        later = f", {fmt(growth, 2)}x at step {step}" if step != start else ""
        if overflow:
            later = f", non-finite at step {step}"
        return [Finding(
            self.KIND, where, start, "error",
            f"the gradient norm is {fmt(first_growth, 2)}x its early level {fmt(level)} at step {start}{later}; "
            f"it grew most in {where!r} ({fmt(per[index], 2)}x its own early norm)",
            SUGGESTION,
            {"growth": plain(first_growth), "early_level": plain(level), "layer_growth": plain(per[index])},
        )]

    # -- the input end against the output end ---------------------------------------------------

    def _relative(self, step, entry, history):
        ratios = history.relative_gradients(entry)
        if ratios is None:
            self.streak.see(step, False)
            self.relative = []
            return []
        ref = max(r for _, r in ratios[-2:])
        first = min(ratios[0][1], ratios[1][1]) if len(ratios) >= 4 else ratios[0][1]
        growth = first / ref if ref > 0 else 0.0  # no gradient at the output end: blocked, not exploding
        holds = growth >= T.EXPLODE_RATIO
        if not holds:
            self.relative = []
        else:
            self.relative.append((step, growth, dict(ratios)))
        if not self.streak.see(step, holds):
            return []
        start, first_growth, first_ratios = self.relative[0]
        indices = [i for i, _ in ratios]
        medians = [statistics.median(r[i] for _, _, r in self.relative if i in r) for i in indices]
        index = indices[robust_argmax(medians)]
        where = module_of(history.name(index))
        return [Finding(
            self.KIND, where, start, "error",
            f"relative to their weights, the gradients at the input end are {fmt(first_growth, 2)}x those at the "
            f"output end at step {start} ({fmt(growth, 2)}x at step {step}); largest in {where!r} "
            f"(||g||/||w|| = {fmt(first_ratios.get(index, math.nan), 2)} at step {start})",
            SUGGESTION,
            {"input_to_output": plain(first_growth), "largest": plain(first_ratios.get(index))},
        )]
