"""``overfit_one_batch``: the model can drive the loss on one small batch close to zero.

Karpathy's "overfit one batch": a model that cannot memorise 16 samples has a bug
(a softmax before ``CrossEntropyLoss``, a detached or frozen layer, a wrong
target format, a capacity bottleneck) or an optimizer that cannot move it.
A copy (dropout off, BatchNorm in train mode) is trained with Adam at
``LR = 1e-2`` (or a fresh copy of the ``optimizer=`` passed to ``run``) on the
first ``SAMPLES = 16`` samples for at most ``MAX_STEPS = 300`` steps, stopping as
soon as the loss is close to zero; the result says after how many steps.

"Close to zero" is ``<= 5%`` of a reference loss: ln C for classification (the
loss of a uniform guess; 5% of ln 10 is 0.115, a mean probability of about 0.89
on the right class) and the initial loss for regression (95% of the initial
error explained). Digits MLPs and CNNs get there in 10 to 40 steps, a small
causal transformer or an LSTM in under 100; if Adam at 1e-2 does not, the check
tries once more at 1e-3 before it fails.
"""

import math

from . import training
from .report import CheckResult

NAME = "overfit_one_batch"
SAMPLES = 16
MAX_STEPS = 300
LR = 1e-2
RETRY_LR = 1e-3
RELATIVE = 0.05


def check(problem):
    """Train a copy on one small batch until its loss is close to zero."""
    x, y = problem.small_batch(SAMPLES)
    if problem.classification:
        reference = math.log(problem.classes(problem.initial_output))
        what = "ln C"
    else:
        reference = None
        what = "the initial loss"
    attempts = [LR] if problem.optimizer is not None else [LR, RETRY_LR]
    for lr in attempts:
        model, _ = problem.copy(dropout=False)
        params = training.trainable_params(problem, model)
        if not params:
            return CheckResult(NAME, False, None, "", "no parameter requires grad", "unfreeze the model")
        optimizer = problem.make_optimizer(params, lr)
        if reference is None:
            reference = training.train(model, problem.loss_fn, x, y, optimizer, 0)[0]
        target = RELATIVE * reference
        losses = training.train(model, problem.loss_fn, x, y, optimizer, MAX_STEPS, target)
        if losses[-1] <= target:
            break
    steps = len(losses) - 1
    ratio = losses[-1] / reference if reference > 0 else 0.0
    how = f"Adam, lr {lr:g}" if problem.optimizer is None else type(optimizer).__name__
    passed = math.isfinite(ratio) and ratio <= RELATIVE
    if passed:
        message = f"loss {losses[0]:.3g} -> {losses[-1]:.3g} on {len(x)} samples in {steps} steps ({how})"
        return CheckResult(NAME, True, ratio, f"<= {RELATIVE:g}", message)
    message = (f"loss {losses[0]:.3g} -> {losses[-1]:.3g} on {len(x)} samples after {steps} steps ({how}); "
               f"needs <= {RELATIVE:g} x {what} = {target:.3g}")
    if not math.isfinite(losses[-1]):
        fix = "the loss diverged: check the loss and the init scale, or lower the learning rate"
    elif training.looks_like_probabilities(problem, problem.initial_output):
        fix = "the model outputs probabilities: remove the softmax, CrossEntropyLoss applies log-softmax itself"
    else:
        fix = ("look for a detached or frozen layer (see nonzero_gradients), targets in the wrong format, "
               "a bottleneck, or an optimizer that cannot move the model")
    return CheckResult(NAME, False, ratio, f"<= {RELATIVE:g}", message, fix)
