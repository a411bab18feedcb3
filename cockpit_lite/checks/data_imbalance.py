"""``data_imbalance``: the training split's classes are balanced, or imbalanced as the data is.

Counts the training labels (``data["y_train"]``: class indices, or one-hot / probability
rows, read by argmax); with ``num_classes`` a class that never occurs counts as 0. At a
ratio of the most to the least frequent class above ``RATIO`` (10:1) a model reaches a low
loss by predicting the frequent classes, and accuracy hides it. That is a bug when the
split or a subsampling skewed the training labels, and a property of the data when the
held-out split is imbalanced alike. So an imbalanced training split is compared with
``data["y_test"]``: the most frequent training class's share in both splits, by a
two-proportion z-test.

- passes: ratio ≤ ``RATIO``; or above it, with the test split's share of that class within
  ``Z`` (3) standard errors of the training split's (imbalanced data: the message says so
  and the fix for it);
- fails: ratio above ``RATIO`` and the shares differ by more than ``Z`` standard errors (one
  class kept whole and the others subsampled: 68 % against 10 %);
- inconclusive, with what to pass: no training labels, fewer than ``MIN_PER_CLASS`` (5) labels per class (a
  ratio of counts that small is noise: 48 labels of 10 classes miss a class on 5 % of
  draws), or an imbalanced training split without ``y_test``, or a test split too small to
  resolve a difference of ``RESOLUTION`` (25 points) in the share (``Z`` standard errors larger
  than it). A skewed split moves the share by far more (68 % against 10 % above).

Skipped for regression and for ``causal_lm`` (token frequencies are skewed by nature).
"""

import math

import numpy as np

from . import splits
from .report import CheckResult

NAME = "data_imbalance"
RATIO = 10.0
MIN_PER_CLASS = 5
Z = 3.0
RESOLUTION = 0.25

TO_PASS = "pass data={'y_train': ..., 'y_test': ...}: the whole training labels and a held-out split"


def _labels(array):
    if splits.is_float(array) and array.ndim == 2:
        array = array.argmax(1)
    return np.asarray(array).reshape(-1).astype(np.int64)


def check(problem):
    """Ratio of the largest to the smallest class count in the training labels, against the test split's."""
    if problem.task != "classification":
        return CheckResult.skip(NAME, f"task {problem.task!r}: no class balance to check")
    given = splits.given(problem, "y_train", "y_test")
    if "y_train" not in given:
        return CheckResult.undecided(NAME, "one batch is too small to count classes", TO_PASS)
    labels = _labels(given["y_train"])
    if not len(labels):
        return CheckResult.undecided(NAME, "data['y_train'] holds no labels", TO_PASS)
    counts = np.bincount(labels, minlength=problem.num_classes or 0)
    ratio = counts.max() / counts.min() if counts.min() > 0 else float("inf")
    threshold = f"<= {RATIO:g}"
    rare, common = int(counts.argmin()), int(counts.argmax())
    message = (f"class {common} has {counts[common]} samples, class {rare} {counts[rare]} "
               f"({len(counts)} classes, {len(labels)} labels)")
    if len(labels) < MIN_PER_CLASS * len(counts):
        return CheckResult.undecided(NAME, f"{message}: fewer than {MIN_PER_CLASS} labels per class, a ratio of "
                                     "counts that small is noise", TO_PASS, float(ratio), threshold)
    if ratio <= RATIO:
        return CheckResult(NAME, True, float(ratio), threshold, message)
    if "y_test" not in given:
        return CheckResult.undecided(NAME, f"{message}; without a test split, imbalanced data cannot be told from "
                                     "a skewed split", TO_PASS, float(ratio), threshold)
    test = _labels(given["y_test"])
    share, test_share = counts[common] / len(labels), float(np.mean(test == common))
    pooled = (counts[common] + test_share * len(test)) / (len(labels) + len(test))
    error = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / len(labels) + 1 / len(test)))
    compared = f"class {common} is {share:.0%} of the training labels and {test_share:.0%} of {len(test)} test labels"
    if abs(share - test_share) > Z * error:
        return CheckResult(NAME, False, float(ratio), threshold, f"{message}; {compared}: the training split is "
                           "skewed", "the split or a subsampling skewed the training labels: split with stratification "
                           "(the same class shares in both splits) and check the filtering of the training split")
    if Z * error > RESOLUTION:
        return CheckResult.undecided(NAME, f"{message}; {compared}, too few test labels to tell a skewed split",
                                     TO_PASS, float(ratio), threshold)
    return CheckResult(NAME, True, float(ratio), threshold, f"{message}; {compared}: the data is imbalanced, the "
                       "split is not (re-weight the loss or oversample the rare classes if they matter)")
