"""``data_imbalance``: the most frequent class is at most 10 times as frequent as the rarest.

Counts the training labels (``data["y_train"]``: class indices, or one-hot /
probability rows, read by argmax); with ``num_classes`` a class that never occurs
counts as 0 (ratio ∞). At a ratio above 10:1 a model reaches a low loss by
predicting the frequent classes, and accuracy hides it. Skipped for regression,
for ``causal_lm`` (token frequencies are skewed by nature) and without
``data["y_train"]`` (one batch is too small to count classes).
"""

import numpy as np

from . import splits
from .report import CheckResult

NAME = "data_imbalance"
RATIO = 10.0


def check(problem):
    """Ratio of the largest to the smallest class count in the training labels."""
    if problem.task != "classification":
        return CheckResult.skip(NAME, f"task {problem.task!r}: no class balance to check")
    labels = splits.given(problem, "y_train").get("y_train")
    if labels is None:
        return CheckResult.skip(NAME, "needs data={'y_train': ...}")
    if splits.is_float(labels) and labels.ndim == 2:
        labels = labels.argmax(1)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    counts = np.bincount(labels, minlength=problem.num_classes or 0)
    ratio = counts.max() / counts.min() if counts.min() > 0 else float("inf")
    passed = ratio <= RATIO
    rare, common = int(counts.argmin()), int(counts.argmax())
    message = (f"class {common} has {counts[common]} samples, class {rare} {counts[rare]} "
               f"({len(counts)} classes, {len(labels)} labels)")
    fix = ("re-weight the loss (CrossEntropyLoss(weight=1/frequency)), oversample the rare classes "
           "(WeightedRandomSampler), and set the last layer's bias to log class frequencies")
    return CheckResult(NAME, bool(passed), float(ratio), f"<= {RATIO:g}", message, "" if passed else fix)
