"""Per-layer ratios to the parameter norm (shared by ``grad_ratio`` and ``update_ratio``)."""

import numpy as np

from .. import data
from ._common import layer_names

NORM = "ParamNorm"


def matrix(record, key, options):
    """``(steps, matrix [parameters, steps], names)`` of ``record[s][key][i] / ParamNorm[i]``."""
    steps, columns = [], []
    for s in sorted(record):
        entry = record[s]
        top, bottom = entry.get(key), entry.get(NORM)
        if not isinstance(top, (list, tuple)) or not isinstance(bottom, (list, tuple)):
            continue
        n = min(len(top), len(bottom))
        with np.errstate(all="ignore"):
            # numpy division: a zero-initialised tensor (‖θ‖ = 0) has no ratio (NaN, drawn grey), not an error
            column = np.array([np.float64(data.to_float(top[i])) / data.to_float(bottom[i]) for i in range(n)])
        column[~np.isfinite(column)] = np.nan
        steps.append(s)
        columns.append(column)
    if not columns:
        return np.array([]), np.empty((0, 0)), []
    width = max(len(c) for c in columns)
    out = np.full((width, len(columns)), np.nan)
    for j, column in enumerate(columns):
        out[: len(column), j] = column
    names = layer_names(record, options)[:width]
    names += [f"param_{i}" for i in range(len(names), width)]
    return np.asarray(steps, dtype=float), out, names


def has(record, key):
    """Whether some step holds both ``key`` and ``ParamNorm`` as per-parameter lists."""
    return any(isinstance(e.get(key), (list, tuple)) and isinstance(e.get(NORM), (list, tuple))
               for e in record.values())
