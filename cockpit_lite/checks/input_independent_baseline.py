"""``input_independent_baseline``: training on the real inputs beats training on zeroed inputs.

Karpathy's input-independent baseline: with the inputs set to zero (token id 0
for integer inputs) a model can only learn the targets' marginal distribution.
Two copies with the same initialisation are trained for ``STEPS = 30`` steps
(Adam at 1e-2, dropout off, or a fresh copy of ``optimizer=``), one on the real
inputs and one on zeros, and compared twice:

- on the training samples (the first 16 of the batch): passes when the final loss
  on real inputs is ``<= RATIO = 0.9 x`` the zero-input one. A model that ignores
  its input (a wrong variable in ``forward``, a multiplication by zero, an input that
  never reaches the output) gives exactly the same two runs, a ratio of 1. This ratio
  is the result's ``value``.
- on held-out samples (classification and regression; a language model's targets are
  its inputs shifted, they cannot be shuffled apart): two more copies are trained on
  the whole batch and evaluated (eval mode) on up to ``HELD = 512`` samples of
  ``data=``'s test split (else the last of the train split; without ``data=``, the batch is
  split in halves, trained on the first). A model trained on real inputs memorises
  labels shuffled apart from their inputs, so only held-out samples tell: it must
  beat the zero-input model there. Classification: its held-out accuracy must exceed the
  best input-free guess's (the zero-input model's, or the most frequent held-out class)
  by ``HELD_GAIN = 0.1`` scaled by the guess's headroom, ``(1 − guess) / (1 − 1/C)``
  (1 for balanced classes; with 85 % of one class of 10 it is 0.17: an input-free guess
  that scores 85 % leaves no 10 points to gain), or by 2 standard errors of that guess,
  when more. A model with another bug that learns a little, e.g. a huge initialisation
  at 30 % against 14 %, passes: this check is about inputs that do not predict the
  labels. Regression: held-out loss ``<= HELD_RATIO = 0.7 x`` the zero-input one.

A model whose training on zeroed inputs ends non-finite while the real inputs give a finite
loss has no input-free baseline: *inconclusive* (it read as a ratio of 1, "does not use its
input").
The held-out comparison decides only what its data can: short of a pass it is
*inconclusive* (never failed), with what to pass, when 2 standard errors of the guess
are at least the gain it needs (too few held-out samples to resolve it), or when it
fails on samples split from the batch (no ``data=``: a handful of samples after 30
steps, on which a healthy recurrent model, say, does not generalise).
"""

import math

import torch

from . import training
from .overfit_one_batch import LR, SAMPLES
from .report import CheckResult
from .splits import given

NAME = "input_independent_baseline"
STEPS = 30
RATIO = 0.9
HELD = 512
HELD_RATIO = 0.7
HELD_GAIN = 0.1
"""Classification: held-out accuracy points the real-input model must gain over the best input-free
guess (or 2 standard errors, when more). Measured on the check cases (360 held-out digits): healthy
MLP / BN-CNN / row-LSTM +0.58 - +0.72; labels shuffled within the batch (3 permutations x 3 models)
-0.06 - +0.105; the broken cases with other bugs (huge init, frozen layer, view-for-transpose LSTM)
learn a little and pass."""
"""Regression, measured on the check cases: the healthy regression MLP 0.22; labels shuffled within
the batch (3 permutations) 1.65 - 3.0."""


def _trained(problem, x, y):
    model, _ = problem.copy(dropout=False)
    params = training.trainable_params(problem, model)
    losses = training.train(model, problem.loss_fn, x, y, problem.make_optimizer(params, LR), STEPS)
    return model, losses[-1]


def _held_out_split(problem):
    """``(x_train, y_train, x_held, y_held, where, from the batch?)`` or ``None``."""
    data = given(problem, "x_test", "y_test", "x_train", "y_train")
    for key in ("test", "train"):
        if f"x_{key}" in data and f"y_{key}" in data:
            # the batch may come from the start of the train split: held-out means not in it, so its end
            kept = slice(-HELD, None) if key == "train" else slice(HELD)
            x = torch.as_tensor(data[f"x_{key}"])[kept].to(problem.x.dtype)
            y = torch.as_tensor(data[f"y_{key}"])[kept].to(problem.y.dtype)
            return problem.x, problem.y, x, y, f"{len(x)} samples of data['{key}']", False
    half = problem.batch_size // 2
    if half < 8:
        return None
    return problem.x[:half], problem.y[:half], problem.x[half:], problem.y[half:], \
        f"the second half of the batch ({problem.batch_size - half} samples)", True


def _score(problem, model, x, y):
    """Held-out error rate (classification) or loss (regression)."""
    model.eval()
    with torch.no_grad():
        out = model(x)
        if problem.task == "classification":
            if out.dim() >= 2 and out.shape[1] > 1:
                predicted = out.argmax(1)
            else:  # one logit
                predicted = (out.reshape(len(out)) > 0).to(y.dtype)
            return float((predicted.reshape(y.shape) != y).float().mean())
        return float(problem.loss_fn(out, y))


TO_DECIDE = ("pass data={'x_test': ..., 'y_test': ...} with a held-out split of a few hundred samples "
             "(or data={'x_train': ..., 'y_train': ...} beyond the batch)")
"""What an inconclusive held-out comparison asks for."""


def _held_out(problem):
    """``(ratio, message, undecided)`` of the held-out comparison (``ratio`` None: not made);
    ``undecided`` is why its data cannot decide it, or None."""
    if problem.task not in ("classification", "regression"):
        return None, "held-out comparison skipped (a language model's targets are its inputs)", None
    split = _held_out_split(problem)
    if split is None:
        return None, "held-out comparison skipped (fewer than 16 samples, no data=)", None
    x, y, xh, yh, where, from_batch = split
    real, _ = _trained(problem, x, y)
    zero, _ = _trained(problem, torch.zeros_like(x), y)
    score_real, score_zero = _score(problem, real, xh, yh), _score(problem, zero, torch.zeros_like(xh), yh)
    classes = None
    if problem.task == "classification" and not torch.is_floating_point(yh):  # the best constant guess's error
        counts = torch.bincount(yh.reshape(-1))
        score_zero = min(score_zero, 1.0 - float(counts.max()) / yh.numel())
        classes = max(problem.num_classes or 0, len(counts), 2)
    what = "error rate" if problem.task == "classification" else "loss"
    note = f"held-out {what} {score_real:.3g} vs {score_zero:.3g} on zeroed inputs ({where})"
    undecided = None
    if problem.task == "classification":  # above the best input-free guess by more than 2 standard errors?
        guess = 1.0 - score_zero
        headroom = 1.0 if classes is None else min(1.0, (1.0 - guess) / (1.0 - 1.0 / classes))
        needed, noise = HELD_GAIN * headroom, 2.0 * math.sqrt(max(guess * (1.0 - guess), 1e-12) / len(yh))
        ratio = 0.0 if (1.0 - score_real) - guess > max(needed, noise) else math.inf
        if noise >= needed and not ratio == 0.0:
            undecided = (f"an input-free guess scores {guess:.0%}: {len(yh)} held-out samples cannot resolve the "
                         f"gain of {needed:.2g} that shows the inputs predict the labels (2 standard errors: "
                         f"{noise:.2g})")
    else:
        ratio = score_real / score_zero if score_zero > 0 else (1.0 if score_real == 0 else math.inf)
    if undecided is None and from_batch and not (math.isfinite(ratio) and ratio <= HELD_RATIO):
        undecided = f"judged on {len(yh)} samples split from the batch only (no data=)"
    return ratio, note, undecided


def check(problem):
    """Compare training on real and on zeroed inputs, on the training samples and on held-out ones."""
    x, y = problem.small_batch(SAMPLES)
    _, real = _trained(problem, x, y)
    _, zero = _trained(problem, torch.zeros_like(x), y)
    threshold = f"<= {RATIO:g} (held-out <= {HELD_RATIO:g})"
    if math.isfinite(real) and not math.isfinite(zero):  # (was taken for a ratio of 1: "does not use its input")
        return CheckResult(NAME, None, math.nan, threshold, (
            f"inconclusive: training on zeroed inputs gave a non-finite loss ({zero:.3g} after {STEPS} steps; "
            f"{real:.3g} on real inputs), so there is no input-free baseline to compare with"), (
            "nothing to fix for training when the real inputs learn (overfit_one_batch): all-zero inputs are "
            "outside what this model computes finitely (e.g. a normalisation of a constant input)"),
            inconclusive=True)
    ratio = real / zero if zero > 0 else 1.0
    passed = math.isfinite(ratio) and ratio <= RATIO
    message = f"after {STEPS} steps: loss {real:.3g} on real inputs vs {zero:.3g} on zeroed inputs"
    fix = ("the model does not use its input: check that forward uses its argument all the way to the output "
           "(no torch.zeros_like, no * 0, no cached or wrong tensor)")
    if passed:
        held, note, undecided = _held_out(problem)
        message += f"; {note}"
        if undecided is not None:
            return CheckResult(NAME, None, ratio, threshold, f"inconclusive on held-out samples: {undecided}; "
                               f"{message}", TO_DECIDE, inconclusive=True)
        if held is not None and not (math.isfinite(held) and held <= HELD_RATIO):
            passed = False
            fix = ("the inputs do not predict the labels on held-out samples (the model only memorises them): "
                   "check that inputs and labels are shuffled together (one permutation / the same dataset index) "
                   "and that the label column is the right one")
    return CheckResult(NAME, passed, ratio, threshold, message, "" if passed else fix)
