"""``exploding_gradients``: gradients orders of magnitude larger than they should be.

Three conditions, any one is enough (reported once):

- *at initialisation*: on each of the first ``SUSTAIN`` records, the activations of the
  unbounded activation modules (ReLU family, GELU, SiLU, ...; ``ActivationStats``, in the
  order they ran) grow by a factor ≥ ``ACT_GAIN`` per module on average: g = (RMS_last /
  RMS_first)^(1/(k−1)) over k ≥ 2 modules, RMS = √(mean² + std²). A layer's forward gain is
  its backward gain too (the same Jacobian), so the gradients grow by g per layer towards
  the input: weights drawn with std 1 (``torch.randn``) instead of ~√(2/fan_in) give
  g ≈ √(fan_in/2). In a homogeneous ReLU net every layer's ‖g‖/‖θ‖ grows alike, so the
  relative test below cannot see it, and the gradient norm starts high instead of growing.
  Layer: ``None`` (every layer's initialisation).

- *growth*: the total gradient norm ‖g‖ is ≥ ``EXPLODE_GROWTH`` times its early level (the
  median of its first 3 finite records that had not grown so, checked from the second
  record on) on one record (an LSTM without clipping goes 0.6 → 15,600 in 3 steps, then NaN;
  an identity-initialised RNN 29 → 28,000 in one step, then back or NaN). Checked at every
  record of the run, so gradients that start exploding late are found at the first record
  that shows it; a loss that spikes at the same time does not hide it.
  Layer: the weight tensor with the largest relative gradient ‖g‖/‖θ‖ at that record (the
  first, in record order, within a factor 2 of the largest: a near-tie of floats never
  decides it), where the backward signal is amplified: an RNN's recurrent matrix, not the
  embedding that inherits its gradient (whose growth over its own small early norm is as
  large). Without parameter norms, the parameter whose own norm grew most over its early level;
  if none grew (the growth is in tensors without an early gradient of their own: zero, or not
  recorded), the largest gradient. The message quotes a tensor's growth over its own early
  norm, or says it had none (never "0x").
- *input to output*: relative gradients r = ‖g‖/‖θ‖ (weight tensors, tiny and zero-initialised
  ones left out, see ``History.relative_gradients``) at the input end ≥ ``EXPLODE_RATIO`` times
  those at the output end (max r of the last two), sustained ``SUSTAIN`` records. The input end
  is the *smaller* r of the first two weight tensors, so one odd tensor cannot fire on its own.
  Layer: the first weight tensor whose r (median over the streak) is within a factor 2 of the
  largest.
"""

import statistics

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, forward_gain, module_of, plain, rss
from cockpit_lite.diagnosis.rules.base import Rule

SUGGESTION = ("clip the gradient norm (torch.nn.utils.clip_grad_norm_), use a variance-preserving initialisation "
              "(Kaiming/Xavier), add normalisation layers or residual connections")


def robust_argmax(values):
    """Index of the first of ``values`` within a factor 2 of the largest (stable under float noise)."""
    largest = max(values)
    return next(i for i, v in enumerate(values) if v >= 0.5 * largest)


class ExplodingGradients(Rule):
    KIND = "exploding_gradients"
    SIGNALS = ("GradNorm", "ParamNorm", "ActivationStats")

    def __init__(self):
        self.done = False
        self.streak = Streak(T.SUSTAIN)
        self.relative = []       # (step, growth, ratios) of the current input-to-output streak
        self.initial = []        # (step, gain, chain) of the first records with a forward gain

    def observe(self, step, entry, history):
        grads = entry.get("GradNorm")
        if self.done or not hasattr(grads, "__len__") or not len(grads):
            return []
        norms = [float(g) for g in grads]
        total = rss(norms)
        found = self._initial(step, entry) or self._growth(step, entry, total, norms, history)
        if found:
            self.done = True
            return found
        found = self._relative(step, entry, history)
        if found:
            self.done = True
        return found

    # -- the activations' growth through the layers at initialisation ----------------------------

    def _initial(self, step, entry):
        gain = forward_gain(entry) if len(self.initial) < T.SUSTAIN else None
        if gain is None:
            return []
        self.initial.append((step, *gain))
        if len(self.initial) < T.SUSTAIN or min(g for _, g, _ in self.initial) < T.ACT_GAIN:
            return []
        start, first_gain, chain = self.initial[0]
        (low_name, low), (high_name, high) = chain[0], chain[-1]
        return [Finding(
            self.KIND, None, start, "error",
            f"at step {start} the activations grow {fmt(first_gain, 2)}x per layer on average (RMS {fmt(low)} in "
            f"{low_name!r} to {fmt(high)} in {high_name!r}, {len(chain)} activation modules; still "
            f"{fmt(self.initial[-1][1], 2)}x at step {step}): the initial weights are too large, and the gradients "
            "grow by the same factor per layer towards the input",
            "initialise the weights for the activation (Kaiming: std sqrt(2/fan_in) for ReLU, or PyTorch's default "
            "init instead of torch.randn), or add normalisation layers",
            {"gain": plain(first_gain), "rms_first": plain(low), "rms_last": plain(high), "modules": len(chain)},
        )]

    # -- the total norm against its early level -------------------------------------------------

    def _growth(self, step, entry, total, norms, history):
        if not (finite(total) and total > 0) or any(s == step for s, _, _ in history.grads):
            return []  # a record of the early level (History.grads) is not judged against it
        level = history.grad_level
        growth = total / level
        if growth < T.EXPLODE_GROWTH:
            return []
        per = []  # each tensor's growth over its own early norm, None without one
        for i, now in enumerate(norms):
            before = [n[i] for _, _, n in history.grads if i < len(n)]  # History.grads: finite totals, finite norms
            base = statistics.median(before) if before else 0.0
            per.append(now / base if base > 0 else None)
        # the layer: the weight tensor whose gradient is largest against its weights, where the backward signal
        # is amplified (an RNN's recurrent matrix); a tensor's growth over its own early norm would reward a
        # small early gradient instead (the embedding the RNN feeds its gradient to)
        relative = dict(history.relative_gradients(entry) or ())
        if relative:
            indices = sorted(relative)
            index = indices[robust_argmax([relative[i] for i in indices])]
        else:  # no parameter norms: the largest growth over its own early norm, else the largest gradient
            grown = [g if g is not None and g > 1 else 0.0 for g in per]
            index = robust_argmax(grown) if max(grown) > 0 else robust_argmax(norms)
        own = "no early gradient of its own" if per[index] is None else f"{fmt(per[index], 2)}x its own early norm"
        where = module_of(history.name(index))
        return [Finding(
            self.KIND, where, step, "error",
            f"the gradient norm is {fmt(growth, 2)}x its early level {fmt(level)} at step {step}; largest "
            f"against its weights in {where!r} ({own}"
            + (f", ||g||/||w|| = {fmt(relative[index], 2)})" if index in relative else ")"),
            SUGGESTION,
            {"growth": plain(growth), "early_level": plain(level), "layer_growth": plain(per[index]),
             "relative": plain(relative.get(index))},
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
        start, first_growth, _ = self.relative[0]
        indices = [i for i, _ in ratios]
        medians = [statistics.median(r[i] for _, _, r in self.relative if i in r) for i in indices]
        index = indices[robust_argmax(medians)]
        # its r at the first record of the streak that has one (a tensor too small to judge there may join later)
        seen, largest = next((s, r[index]) for s, _, r in self.relative if index in r)
        where = module_of(history.name(index))
        return [Finding(
            self.KIND, where, start, "error",
            f"relative to their weights, the gradients at the input end are {fmt(first_growth, 2)}x those at the "
            f"output end at step {start} ({fmt(growth, 2)}x at step {step}); largest in {where!r} "
            f"(||g||/||w|| = {fmt(largest, 2)} at step {seen})",
            SUGGESTION,
            {"input_to_output": plain(first_growth), "largest": plain(largest)},
        )]
