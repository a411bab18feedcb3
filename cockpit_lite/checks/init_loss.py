"""``init_loss``: the loss at initialisation is close to ln C (classification).

A freshly initialised classifier should be unsure: predicting the uniform
distribution over C classes gives a cross-entropy of ln C. Far above that, the
initial logits are large (inputs not normalised, too large an init scale, a last
layer that needs scaling down), and the first steps are spent undoing it.
One-sided: ``loss / ln C <= 1.5`` passes (a loss below ln C is fine). Healthy
default initialisations give logits with a standard deviation below 1, a ratio
of 1.0 to 1.3 for 2 to 50 classes (std 0.5: 1.03-1.08, std 1: 1.12-1.29); 1.5
is crossed at a logit std of about 1.5 (2 classes) to 2.5 (50 classes), while
unnormalised inputs or a large init scale give ratios of 3 to 100.
Skipped for regression (there is no reference loss).
"""

import math

from .report import CheckResult

NAME = "init_loss"
RATIO = 1.5


def check(problem):
    """Compare the loss of a copy of the model at initialisation with ln C."""
    classes, skipped = problem.initial_classes(NAME, "regression: ln C applies to classification only")
    if skipped is not None:
        return skipped
    out = problem.initial_output
    loss = float(problem.loss_fn(out, problem.y))
    reference = math.log(classes)
    ratio = loss / reference
    passed = math.isfinite(ratio) and ratio <= RATIO
    message = f"loss {loss:.3g} at initialisation vs ln C = {reference:.3g} (C = {classes})"
    fix = ("the initial logits are too large: check the input scale (see data_normalization) and the init "
           "scale; scale the last layer down (e.g. multiply its weights by 0.01, zero its bias)")
    return CheckResult(NAME, passed, ratio, f"<= {RATIO:g}", message, "" if passed else fix)
