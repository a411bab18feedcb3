"""``data_normalization``: the input features are roughly mean 0 and standard deviation 1.

Over all entries of the training inputs (``data["x_train"]``, or the batch without
``data=``): passes when ``|mean| <= 1`` and ``0.2 <= std <= 5``, and when no feature
(column after flattening a sample) has a standard deviation more than 100 times
the median one among the non-constant features. "Roughly" is meant: images scaled
to [0, 1] (mean about 0.3, std about 0.4) pass; pixels on 0..255 (std about 100),
digits on 0..16 (mean about 5) or a column in dollars next to columns in units
fail. The test split must pass too and agree with the training split (means
within half a training std, stds within a factor of 2): normalising only one
split is a common bug. Skipped for integer inputs (token ids are not features).
The value is the training inputs' std; the message gives the mean and the fix.
"""

import numpy as np

from . import splits
from .report import CheckResult

NAME = "data_normalization"
MEAN = 1.0
STD = (0.2, 5.0)
SPREAD = 100.0
AGREEMENT = (0.5, 2.0)
THRESHOLD = f"|mean|<={MEAN:g}, {STD[0]:g}<=std<={STD[1]:g}"


def _finite_rows(array):
    """``array``'s samples of finite values only, as rows, and its shape as ``(samples, values per sample)``."""
    values = splits.rows(array)
    return values[np.isfinite(values).all(1)], values.shape


def _stats(finite):
    stds = finite.std(0) if len(finite) > 1 else np.zeros(finite.shape[1])
    varying = stds[stds > 0]
    spread = float(varying.max() / np.median(varying)) if varying.size else 1.0
    return float(finite.mean()), float(finite.std()), spread, int(stds.argmax()) if stds.size else 0


def _problems(label, mean, std, spread, widest):
    found = []
    if abs(mean) > MEAN:
        found.append(f"|mean| > {MEAN:g}")
    if not STD[0] <= std <= STD[1]:
        found.append(f"std outside [{STD[0]:g}, {STD[1]:g}]")
    if spread > SPREAD:
        found.append(f"feature {widest} has {spread:.3g}x the median feature std")
    return [f"{label}: " + ", ".join(found)] if found else []


def _fix(mean, std, spread, finite):
    if spread > SPREAD:
        return "standardise each feature (column) with the training split's per-feature mean and std"
    low, high = float(finite.min()), float(finite.max())
    if low >= 0 and 1 < high <= 255:
        return f"the inputs look like raw pixels in 0..{high:.0f}: divide by {high:.0f} (or standardise)"
    return f"standardise with the training split's statistics: x = (x - {mean:.4g}) / {std:.4g}"


def check(problem):
    """Mean, std and per-feature spread of the training (and test) inputs."""
    arrays, source = splits.inputs_and_targets(problem)
    inputs = {k: a for k, a in arrays.items() if k.startswith("x")}
    if not inputs:
        return CheckResult.skip(NAME, "needs data={'x_train': ...} or a batch")
    if not all(splits.is_float(a) for a in inputs.values()):
        return CheckResult.skip(NAME, "integer inputs (token ids or indices) are not normalised")
    finite = {}
    for label, array in inputs.items():
        finite[label], (samples, values) = _finite_rows(array)
        if not finite[label].size:
            return CheckResult.undecided(
                NAME, f"{label} ({samples} samples of {values} values) has no sample of finite values only",
                "pass inputs with at least one sample of finite values (see data_nonfinite)")
    (first, train), *others = finite.items()
    mean, std, spread, widest = _stats(train)
    found = _problems(first, mean, std, spread, widest)
    fix = _fix(mean, std, spread, train) if found else ""
    for label, rows in others:
        t_mean, t_std, t_spread, t_widest = _stats(rows)
        wrong = _problems(label, t_mean, t_std, t_spread, t_widest)
        if abs(t_mean - mean) > AGREEMENT[0] * std or not AGREEMENT[0] <= t_std / max(std, 1e-12) <= AGREEMENT[1]:
            wrong.append(f"{label} (mean {t_mean:.3g}, std {t_std:.3g}) is not scaled like {first}")
        elif wrong:
            wrong = [f"{wrong[0]} (mean {t_mean:.3g}, std {t_std:.3g})"]
        if wrong and not fix:
            fix = "normalise the test split with the training split's statistics, exactly as the training split"
        found += wrong
    message = f"{first}: mean {mean:.3g}, std {std:.3g}" + (f"; {'; '.join(found)}" if found else "")
    return CheckResult(NAME, not found, std, THRESHOLD, message, fix)
