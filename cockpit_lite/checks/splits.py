"""The data the data checks read: the ``data=`` splits as numpy arrays, or the batch itself."""

import numpy as np
import torch

KEYS = ("x_train", "y_train", "x_test", "y_test")


def as_numpy(array):
    if isinstance(array, torch.Tensor):
        return array.detach().cpu().numpy()
    return np.asarray(array)


def given(problem, *keys):
    """``{key: array}`` of those ``keys`` present in ``data=``."""
    data = problem.data or {}  # (its keys are checked by ``Problem``)
    return {k: as_numpy(data[k]) for k in keys if data.get(k) is not None}


def inputs_and_targets(problem):
    """``({name: array}, source)``: every given split, or the batch when ``data=`` has none."""
    arrays = given(problem, *KEYS)
    if arrays:
        return arrays, "data"
    return {"x (batch)": as_numpy(problem.x), "y (batch)": as_numpy(problem.y)}, "the batch (no data= given)"


def is_float(array):
    return np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.complexfloating)


def rows(array):
    """``array`` as ``(N, features)`` float64 (one row per sample)."""
    values = np.asarray(array, dtype=np.float64)
    return values.reshape(len(values), int(np.prod(values.shape[1:])))
