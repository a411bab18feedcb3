"""``batch_independence_forward`` and ``batch_independence_backward``: samples do not mix.

A model must treat every sample of a batch on its own: changing sample j must not
change the output of sample i ≠ j (forward), and the gradient of sample i's output
with respect to sample j's input must be zero (backward; for integer tokens, with
respect to the output of the input embedding). Typical bugs: ``x - x.mean(0)``,
a ``view`` / ``reshape`` that should have been a ``transpose`` (it moves features
of one sample into another), a sequence model fed (T, B, ...) as batch-first.

Layers that mix samples by design in train mode (BatchNorm) are put in eval mode
on the copy, which the result message says; dropout stays on, with the same seed
for both forward passes. Samples probed: the first, middle and last of the batch.
Threshold: relative leak ``<= 1e-5`` (``dependence.LEAK``).
"""

import torch

from . import dependence
from .report import CheckResult

FIX = ("the model mixes samples of a batch: look for reductions or reshapes over axis 0 "
       "(x.mean(0), view instead of transpose/permute, batch_first mismatch)")


def _samples(problem):
    n = problem.batch_size
    return sorted({0, n // 2, n - 1})


def _others(problem, i):
    return (torch.arange(problem.batch_size, device=problem.x.device) != i,)


def _one_sample(name):
    return CheckResult.undecided(name, "one sample has no other sample to leak into", "pass a batch of at least 2 samples")


def forward(problem):
    """Changing sample j leaves every other sample's output unchanged."""
    name = "batch_independence_forward"
    if problem.batch_size < 2:
        return _one_sample(name)
    model, notes = problem.copy(mixing="eval")
    cases = [(_others(problem, j), (j,)) for j in _samples(problem)]
    leak = dependence.forward_leak(problem, model, cases)
    what = "changing sample j moves the outputs of other samples" if leak > dependence.LEAK else \
        "changing one sample leaves the other samples' outputs unchanged"
    return dependence.result(name, leak, what, notes, FIX)


def backward(problem):
    """The gradient of sample i's output with respect to sample j's input is zero."""
    name = "batch_independence_backward"
    if problem.batch_size < 2:
        return _one_sample(name)
    cases = [((i,), _others(problem, i), (i,)) for i in _samples(problem)]
    return dependence.backward_check(
        name, problem, cases,
        "sample i's output has a gradient w.r.t. {where} of other samples",
        "gradients of each sample's output w.r.t. {where} of other samples are zero",
        FIX,
    )
