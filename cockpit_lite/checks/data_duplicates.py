"""``data_duplicates``: no test sample is also in the training split.

Hashes every sample (row) of ``x_train`` and ``x_test``. Exact and near-exact
duplicates count: floating inputs are rounded to 4 decimals in units of the
training split's standard deviation before hashing, so a copy that went through
a float32/float64 round trip or a re-encoding is still found (two values within
1e-4 std of each other can still fall on the two sides of a rounding boundary;
such pairs are missed). A duplicate makes the test score measure memorisation.
Threshold: none. Inconclusive without both ``x_train`` and ``x_test``, or when one
of them has no sample.
"""

import hashlib

import numpy as np

from . import splits
from .report import CheckResult

NAME = "data_duplicates"
DECIMALS = 4


def _keys(array, scale):
    if splits.is_float(array):
        array = np.round(splits.rows(array) / scale, DECIMALS) + 0.0  # + 0.0 turns -0.0 into 0.0
    else:
        array = np.ascontiguousarray(array).reshape(len(array), -1)
    return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in array]


def check(problem):
    """Count the test samples whose (rounded) row also occurs in the training split."""
    arrays = splits.given(problem, "x_train", "x_test")
    if len(arrays) < 2:
        return CheckResult.undecided(NAME, "one batch cannot show a leak between splits",
                                     "pass data={'x_train': ..., 'x_test': ...}")
    train, test = arrays["x_train"], arrays["x_test"]
    for label, array in arrays.items():
        if len(array) == 0:
            return CheckResult.undecided(NAME, f"{label} has no sample (shape {tuple(array.shape)})",
                                         "pass non-empty splits x_train and x_test")
    scale = float(np.nanstd(splits.rows(train))) if splits.is_float(train) else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0
    train_keys = _keys(train, scale)
    seen = set(train_keys)
    shared = [i for i, key in enumerate(_keys(test, scale)) if key in seen]
    within = len(train_keys) - len(seen)
    note = f"; {within} repeated rows within the training split" if within else ""
    if not shared:
        return CheckResult(NAME, True, 0, "== 0",
                           f"none of {len(test)} test samples occurs in the {len(train)} training samples{note}")
    message = (f"{len(shared)} of {len(test)} test samples ({len(shared) / len(test):.1%}) also occur in the "
               f"training split (test indices {shared[:5]}{' ...' if len(shared) > 5 else ''}){note}")
    fix = "deduplicate before splitting, or drop these samples from the test split"
    return CheckResult(NAME, False, len(shared), "== 0", message, fix)
