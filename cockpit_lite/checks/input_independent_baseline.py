"""``input_independent_baseline``: training on the real inputs beats training on zeroed inputs.

Karpathy's input-independent baseline: with the inputs set to zero (token id 0
for integer inputs) a model can only learn the targets' marginal distribution.
Two copies with the same initialisation are trained for ``STEPS = 30`` steps
(Adam at 1e-2, dropout off, or a fresh copy of ``optimizer=``) on the first 16
samples, one on the real inputs and one on zeros. Passes when the final loss on
real inputs is ``<= 0.9 x`` the zero-input one. A model that ignores its input
(a wrong variable in ``forward``, a multiplication by zero, an input that never
reaches the output) gives exactly the same two runs, a ratio of 1.
"""

import math

import torch

from . import training
from .overfit_one_batch import LR, SAMPLES
from .report import CheckResult

NAME = "input_independent_baseline"
STEPS = 30
RATIO = 0.9


def _final_loss(problem, x, y):
    model, _ = problem.copy(dropout=False)
    params = training.trainable_params(problem, model)
    return training.train(model, problem.loss_fn, x, y, problem.make_optimizer(params, LR), STEPS)[-1]


def check(problem):
    """Compare the final losses of training on real and on zeroed inputs."""
    x, y = problem.small_batch(SAMPLES)
    real = _final_loss(problem, x, y)
    zero = _final_loss(problem, torch.zeros_like(x), y)
    ratio = real / zero if zero > 0 else 1.0
    passed = math.isfinite(ratio) and ratio <= RATIO
    message = f"after {STEPS} steps: loss {real:.3g} on real inputs vs {zero:.3g} on zeroed inputs"
    fix = ("the model does not use its input: check that forward uses its argument all the way to the output "
           "(no torch.zeros_like, no * 0, no cached or wrong tensor)")
    return CheckResult(NAME, passed, ratio, f"<= {RATIO:g}", message, "" if passed else fix)
