"""The learning-rate range test (Smith, "Cyclical Learning Rates for Training Neural Networks", 2017).

On a copy of the model, the learning rate grows exponentially from ``start`` to
``end`` over ``steps`` optimizer steps, one batch each; the loss is smoothed by a
bias-corrected exponential moving average (``SMOOTHING = 0.9``: about 10 steps of
memory, so that the curve lags the learning rate by less than a tenth of the
sweep) and the sweep stops once the smoothed loss exceeds ``DIVERGENCE = 4`` times
its minimum, is not finite, or, after it had fallen below 90% of its first
value, climbs back above that first value (a classifier whose units died at a
too large rate sits at ln C, less than 4 times its minimum, without recovering):
beyond that point it only measures divergence.

Suggested learning rate, rule ``"min/10"``: the learning rate at the minimum of the
smoothed loss, divided by 10. The minimum sits at the edge of instability (a
little more and the loss rises), so one decade below it is still where the loss
falls fast but safely away from the edge; unlike the steepest point of the curve,
which depends on a derivative of a noisy curve, the minimum is stable across
seeds. No suggestion (None) when the smoothed loss never fell ``FLAT = 1%`` below
its start (no descent to speak of).
"""

import csv
import math
from dataclasses import dataclass, field

import torch

from .isolation import endless, forked_rng, fresh_optimizer, model_copy

SMOOTHING = 0.9
DIVERGENCE = 4.0
FLAT = 0.01
RULE = "min/10: one tenth of the learning rate at the minimum of the smoothed loss"


@dataclass
class LRRangeResult:
    """The curve of an LR range test and its suggestion.

    ``lr``, ``loss`` and ``smoothed_loss`` have one entry per step taken; ``diverged``
    says whether the sweep stopped early (at the last entry).
    """

    lr: list
    loss: list
    smoothed_loss: list
    suggested_lr: float | None
    min_lr: float | None
    diverged: bool
    rule: str = RULE
    notes: list = field(default_factory=list)

    def to_dict(self):
        """The result as plain data (what ``instruments.gauges.lr_range.gauge`` draws)."""
        return {"lr": list(self.lr), "loss": list(self.loss), "smoothed_loss": list(self.smoothed_loss),
                "suggested_lr": self.suggested_lr, "min_lr": self.min_lr, "diverged": self.diverged,
                "rule": self.rule}

    def to_csv(self, path):
        """Write ``step,lr,loss,smoothed_loss`` rows under ``#`` header lines holding the suggestion."""
        with open(path, "w", newline="", encoding="utf-8") as file:
            for key in ("suggested_lr", "min_lr", "diverged", "rule"):
                file.write(f"# {key}: {getattr(self, key)}\n")
            writer = csv.writer(file)
            writer.writerow(["step", "lr", "loss", "smoothed_loss"])
            for step, row in enumerate(zip(self.lr, self.loss, self.smoothed_loss)):
                writer.writerow([step, *(repr(float(v)) for v in row)])
        return str(path)

    def __str__(self):
        if self.suggested_lr is None:
            return f"LR range test: no suggestion ({'; '.join(self.notes)})"
        return (f"LR range test: suggested lr {self.suggested_lr:.3g} ({self.rule}); smoothed loss minimal at "
                f"{self.min_lr:.3g}, {len(self.lr)} steps" + (", stopped at divergence" if self.diverged else "")
                + "".join(f"; {n}" for n in self.notes))


def lr_range_test(model, loss_fn, batches, optimizer=None, start=1e-7, end=10.0, steps=100, seed=0):
    """Sweep the learning rate exponentially on a copy of ``model``; return an ``LRRangeResult``.

    Args:
        model: the model (never changed; a deep copy is trained).
        loss_fn: ``loss_fn(model(x), y)`` -> scalar.
        batches: ``(x, y)`` pairs (a list or a re-iterable loader, cycled), or one pair.
        optimizer: None (SGD with momentum 0.9), an Optimizer (a fresh one of the same class
            and hyper-parameters is built on the copy; the user's is never stepped) or a
            callable ``params -> Optimizer``. Its learning rate is overwritten at every step.
        start, end: first and last learning rate of the sweep.
        steps: number of steps (learning rates) of the full sweep.
        seed: seed of the (forked) random state, for dropout.
    """
    if not 0 < start < end or steps < 2:
        raise ValueError("need 0 < start < end and steps >= 2")
    stream = endless(batches)
    first = next(stream)
    twin = model_copy(model)
    params = [p for p in twin.parameters() if p.requires_grad]
    opt = fresh_optimizer(optimizer, params, lambda ps: torch.optim.SGD(ps, lr=start, momentum=0.9))
    lrs, losses, smoothed = [], [], []
    average, best, diverged = 0.0, math.inf, False
    with forked_rng(first[0], seed), torch.enable_grad():
        batch = first
        for step in range(steps):
            lr = start * (end / start) ** (step / (steps - 1))
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = batch
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(twin(x), y)
            value = loss.item()
            average = SMOOTHING * average + (1 - SMOOTHING) * value
            smooth = average / (1 - SMOOTHING ** (step + 1))
            lrs.append(lr), losses.append(value), smoothed.append(smooth)
            best = min(best, smooth)
            undone = best < 0.9 * smoothed[0] and smooth > smoothed[0]
            if not math.isfinite(smooth) or smooth > DIVERGENCE * best or undone:
                diverged = True
                break
            loss.backward()
            opt.step()
            batch = next(stream)
    return _suggest(lrs, losses, smoothed, diverged)


def _suggest(lrs, losses, smoothed, diverged):
    finite = [(s, i) for i, s in enumerate(smoothed) if math.isfinite(s)]
    lowest, at = min(finite)
    notes = []
    if lowest > (1 - FLAT) * smoothed[0]:
        notes.append("the smoothed loss never fell 1% below its start: lower start, or check the model")
        return LRRangeResult(lrs, losses, smoothed, None, None, diverged, notes=notes)
    if not diverged:
        notes.append("the loss had not diverged at the end of the sweep: raise end to see the edge")
    return LRRangeResult(lrs, losses, smoothed, lrs[at] / 10, lrs[at], diverged, notes=notes)
