"""``init_calibration``: predictions at initialisation are close to uniform (classification).

Reads the predictions as ``softmax`` of the output over the class axis (right for
logits, and for log-probabilities too) and measures the mean normalised entropy
``H(p_i) / ln C`` over the samples: 1 for uniform predictions, 0 for one-hot ones.
Passes at ``>= 0.75``: healthy initialisations give 0.8 to 1 (logits with standard
deviation 0.5 give 0.92-0.97, std 1 gives 0.78-0.88, for 2 to 50 classes), while an over-confident start (large
logits from unnormalised inputs or a large init scale, or a last-layer bias that
favours some classes) is far below. Skipped for regression.
"""

import math

import torch

from .report import CheckResult

NAME = "init_calibration"
ENTROPY = 0.75


def check(problem):
    """Mean normalised entropy of the initial predictions."""
    classes, skipped = problem.initial_classes(NAME, "regression: there are no class predictions")
    if skipped is not None:
        return skipped
    out = problem.initial_output
    logp = torch.log_softmax(out.double(), dim=problem.class_axis)
    entropy = -(logp.exp() * logp).sum(problem.class_axis) / math.log(classes)
    value = float(entropy.mean())
    top = float(logp.exp().amax(problem.class_axis).mean())
    passed = math.isfinite(value) and value >= ENTROPY
    message = (f"mean normalised entropy {value:.3f} of the initial predictions, mean top probability "
               f"{top:.3f} (uniform: {1 / classes:.3f})")
    fix = ("the model is confident before training: normalise the inputs, reduce the init scale, "
           "initialise the last layer near zero (bias = log class frequencies for imbalanced data)")
    return CheckResult(NAME, passed, value, f">= {ENTROPY:g}", message, "" if passed else fix)
