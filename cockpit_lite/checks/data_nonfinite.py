"""``data_nonfinite``: no NaN or Inf in the inputs or targets.

Looks at every split given in ``data=`` (or at the batch when there is none) and
counts NaN and ±Inf entries; a single one makes the loss NaN at the step that
draws it. Threshold: none.
"""

import numpy as np

from . import splits
from .report import CheckResult

NAME = "data_nonfinite"


def check(problem):
    """Count non-finite entries per array."""
    arrays, source = splits.inputs_and_targets(problem)
    counts = {k: int(np.size(a) - np.isfinite(a).sum()) for k, a in arrays.items() if splits.is_float(a)}
    total = sum(counts.values())
    if not total:
        return CheckResult(NAME, True, 0, "== 0", f"all entries finite in {source} ({', '.join(arrays)})")
    message = "non-finite entries: " + ", ".join(f"{k} {n}" for k, n in counts.items() if n)
    fix = "drop or impute the rows with NaN/Inf (look for divisions by zero, log(0) or missing values)"
    return CheckResult(NAME, False, total, "== 0", message, fix)
