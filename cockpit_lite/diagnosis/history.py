"""What the rules share: the run so far, updated once per step before the rules look at it.

``History`` is fed the record step by step (in step order) and keeps the few running
summaries several rules need (the loss at initialisation, per-layer gradient and
update ratios), so that no rule recomputes them and no rule needs the whole record.
"""

import math
import statistics

import numpy as np

from cockpit_lite import log as _log
from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.utils import activations

#: Per-parameter lists whose network total is the root of the sum of squares.
RSS = ("GradNorm", "ParamNorm", "UpdateSize")
EARLY = 3
"""Records that make the early gradient level."""


def module_of(param_name):
    """``"encoder.3.weight"`` -> ``"encoder.3"`` (``""`` for a bare parameter of the model)."""
    return param_name.rsplit(".", 1)[0] if "." in param_name else param_name


def finite(value):
    return _log.is_finite_number(value)


def logged(entry, *keys):
    """The first of ``keys`` that ``entry`` holds as a finite number (``cp.log`` stores ``None``s), or ``None``.

    ``logged(entry, "valid_loss", "test_loss")``: the held-out loss, from the valid slot, else the test slot.
    """
    for key in keys:
        value = entry.get(key)
        if finite(value):
            return float(value)
    return None


def unbounded(type_name):
    """Whether an ``ActivationStats`` type's output grows with its input (the forward gain is read on
    these): the ReLU family but ReLU6, GELU, SiLU, ELU, Softplus, Mish and their kin, under any library's
    class name (``cockpit_lite.utils.activations``)."""
    found = activations.family(type_name)
    return found is not None and found.unbounded


def forward_gain(entry):
    """``(g, [(module, RMS)])`` of one record, or ``None`` with fewer than 2 unbounded activation modules.

    RMS = √(mean² + std²) of each ``unbounded`` module's output (``ActivationStats``, in the
    order the modules ran) and g = (RMS_last / RMS_first)^(1/(k−1)), the mean factor by which
    the activations grow from one such module to the next (a layer's forward gain, which is
    its backward gain too).
    """
    stats = entry.get("ActivationStats")
    if not isinstance(stats, dict):
        return None
    chain = []
    for module, values in stats.items():
        if not isinstance(values, dict) or not unbounded(values.get("type")):
            continue
        mean, std = values.get("mean"), values.get("std")
        if finite(mean) and finite(std):
            chain.append((module, math.sqrt(float(mean) ** 2 + float(std) ** 2)))
    if len(chain) < 2 or chain[0][1] <= 0:
        return None
    return (chain[-1][1] / chain[0][1]) ** (1 / (len(chain) - 1)), chain


def learning_rate(entry):
    """The learning rate of a record (``GradPresence``'s, else a logged ``learning_rate``), or ``None``."""
    presence = entry.get("GradPresence")
    if isinstance(presence, dict) and finite(presence.get("lr")):
        return float(presence["lr"])
    return float(entry["learning_rate"]) if finite(entry.get("learning_rate")) else None


def rss(values):
    arr = np.asarray(values, dtype=float)
    return float(np.sqrt(np.sum(arr**2))) if arr.size else math.nan


class History:
    """The run so far (see the module docstring).

    Args:
        names: the tracked parameters' names, in record order (``None``: ``param_i``).
        shapes: their shapes (``None``: a tensor counts as a weight unless its name ends
            in ``bias``).
    """

    def __init__(self, names=None, shapes=None):
        self.names = list(names) if names else None
        self.shapes = [tuple(s) for s in shapes] if shapes else None
        self.step = None
        self.losses = []          # (step, loss), non-finite kept
        self.ratios = []          # (step, ‖Δθ‖/‖θ‖ total), known one step late: not where no optimizer step was,
        #                           nor where the gradient had exploded (then the update measures the gradient)
        self.grads = []           # (step, ‖g‖ total, per-tensor ‖g‖) of the first EARLY records that had not grown
        self.logs = []            # (step, {epoch key: value})
        self.nonfinite_at = None  # the first step with a non-finite loss
        # caches of what the attributes above determine (private: not in the diagnosis's saved state)
        self._relative = (None, None)  # (the record, its relative_gradients)
        self._first = (None, 0, ())    # (the losses list, how many were scanned, its first 3 finite pairs)

    # -- feeding ---------------------------------------------------------------------------

    def update(self, step, entry):
        self.step = step
        exploded = self._see_gradient(step, entry.get("GradNorm"))
        if "Loss" in entry:
            self.losses.append((step, float(entry["Loss"]) if entry["Loss"] is not None else math.nan))
        bad = "nonfinite_loss" in (entry.get(_log.FLAGS) or []) or (self.losses and self.losses[-1][0] == step
                                                                     and not math.isfinite(self.losses[-1][1]))
        if bad and self.nonfinite_at is None:
            self.nonfinite_at = step
        norms, update = entry.get("ParamNorm"), entry.get("UpdateSize")
        if isinstance(norms, (list, tuple, np.ndarray)) and isinstance(update, (list, tuple, np.ndarray)):
            total, moved, lr = rss(norms), rss(update), learning_rate(entry)
            # nothing moved at a positive learning rate: no optimizer step came between this record and the
            # next (a micro-batch of gradient accumulation), which says nothing about the step size
            idle = moved == 0 and lr is not None and lr > 0
            if total > 0 and finite(total) and not idle and not exploded:
                self.ratios.append((step, moved / total))
        epoch = {k: entry[k] for k in _log.EPOCH_KEYS if k in entry}
        if epoch:
            self.logs.append((step, epoch))

    def _see_gradient(self, step, grads):
        """Keep the early gradient level; whether this record's total ‖g‖ is ``EXPLODE_GROWTH`` × above it."""
        if not hasattr(grads, "__len__") or not len(grads):
            return False
        norms = [float(g) for g in grads]
        total = rss(norms)
        if not (finite(total) and total > 0):
            return False
        if len(self.grads) < EARLY and (not self.grads or total < T.EXPLODE_GROWTH * self.grad_level):
            self.grads.append((step, total, norms))
            return False
        return total >= T.EXPLODE_GROWTH * self.grad_level

    # -- reading ---------------------------------------------------------------------------

    @property
    def grad_level(self):
        """The early gradient level: the median total ‖g‖ of the first ``EARLY`` finite records that had not grown
        ``EXPLODE_GROWTH``-fold over the ones before (``nan`` before the first)."""
        return statistics.median(t for _, t, _ in self.grads) if self.grads else math.nan

    def name(self, index):
        return self.names[index] if self.names and index < len(self.names) else f"param_{index}"

    def weights(self, n):
        """Indices of the weight tensors (matrices, kernels, embeddings) among ``n`` parameters."""
        if self.shapes and len(self.shapes) == n:
            picked = [i for i, s in enumerate(self.shapes) if len(s) >= 2]
        else:
            picked = [i for i in range(n) if not self.name(i).endswith("bias")]
        return picked or list(range(n))

    def _first_finite(self):
        """The first (up to 3) finite ``(step, loss)`` pairs, scanning only the losses added since the last call
        (losses only grow; a loaded state brings another list, scanned anew)."""
        losses, seen, first = self._first
        if losses is not self.losses:
            losses, seen, first = self.losses, 0, ()
        if len(first) < 3:
            first += tuple(pair for pair in losses[seen:] if math.isfinite(pair[1]))[:3 - len(first)]
        self._first = (losses, len(losses), first)
        return first

    @property
    def loss_ref(self):
        """L₀: the median of the first 3 finite losses (``nan`` before the first)."""
        first = self._first_finite()
        return statistics.median(v for _, v in first) if first else math.nan

    @property
    def first_finite_loss(self):
        """``(step, loss)`` of the first finite loss, or ``None``."""
        first = self._first_finite()
        return first[0] if first else None

    def recent_losses(self, k):
        return [v for _, v in self.losses[-k:]]

    def median_recent_loss(self, k, finite_only=True):
        values = [v for v in self.recent_losses(k) if math.isfinite(v) or not finite_only]
        return statistics.median(values) if values else math.nan

    def median_recent_ratio(self, k):
        values = [r for _, r in self.ratios[-k:] if math.isfinite(r)]
        return statistics.median(values) if values else math.nan

    def relative_gradients(self, entry):
        """``[(index, ‖g‖/‖θ‖)]`` of the weight tensors at this step, or ``None``.

        A weight tensor whose size per entry (‖θ‖/√numel when the shapes are known, else
        ‖θ‖) is below ``TINY_WEIGHT`` of the median over the weight tensors is left out: a
        zero-initialised tensor (a ViT class token, a zero-initialised head) has a relative
        gradient as large as it likes while its absolute gradient is ordinary.
        """
        if self._relative[0] is not entry:  # (several rules ask about the same record)
            self._relative = (entry, self._relative_gradients(entry))
        return self._relative[1]

    def _relative_gradients(self, entry):
        grads, norms = entry.get("GradNorm"), entry.get("ParamNorm")
        if not isinstance(grads, (list, tuple, np.ndarray)) or not isinstance(norms, (list, tuple, np.ndarray)):
            return None
        if len(grads) != len(norms) or len(grads) < 2:
            return None
        picked = []
        for i in self.weights(len(grads)):
            g, p = float(grads[i]), float(norms[i])
            if finite(g) and finite(p) and p > 0:
                picked.append((i, g, p, p / math.sqrt(self.numel(i)) if self.numel(i) else p))
        if len(picked) < 2:
            return None
        typical = statistics.median(size for *_, size in picked)
        out = [(i, g / p) for i, g, p, size in picked if size >= T.TINY_WEIGHT * typical]
        return out if len(out) >= 2 else None

    def numel(self, index):
        """Entries of parameter ``index`` (``None`` without shapes)."""
        if not self.shapes or index >= len(self.shapes):
            return None
        return math.prod(self.shapes[index])


class Streak:
    """Counts consecutive records on which a condition holds; remembers where the streak began."""

    def __init__(self, length):
        self.length = length
        self.count = 0
        self.start = None
        self.first = None

    def see(self, step, holds, evidence=None):
        """Record one step; returns True when the streak reaches ``length``."""
        if holds:
            if self.count == 0:
                self.start, self.first = step, evidence
            self.count += 1
        else:
            self.count, self.start, self.first = 0, None, None
        return self.count >= self.length


def fmt(value, digits=3):
    """A number for a message: ``0.000123`` -> ``"0.000123"``, ``nan`` -> ``"nan"``."""
    return f"{float(value):.{digits}g}" if value is not None else "n/a"


def plain(value, digits=4):
    """A number for the evidence dict (rounded, Python float)."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")
