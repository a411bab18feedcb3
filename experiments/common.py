"""Shared helpers of the paper experiments (``lr_comparison``, ``noisy_quadratic``,
``vanishing_gradients``, ``data_scaling_bug``).

Everything here is small on purpose: data (scikit-learn's ``load_digits``, which
ships inside the wheel, so nothing is downloaded), models, a minibatch iterator,
evaluation, strict-JSON output and figure saving. Each experiment keeps its own
training loop so that it reads top to bottom like a user's script.
"""

import argparse
import json
import math
import os

import numpy as np
import torch
from torch import nn

from cockpit_lite import demo
from cockpit_lite.demo import evaluate, minibatches  # noqa: F401 (the experiments' loops use them from here)

#: Scalings of the digit images (raw pixel values are integers 0..16).
SCALINGS = ("unit", "standard", "raw255")


def single_thread():
    """Use one CPU thread (the experiments share the machine with benchmarks)."""
    torch.set_num_threads(1)


def parser(name, doc):
    """An ``argparse`` parser with the options every experiment has."""
    p = argparse.ArgumentParser(prog=f"python -m experiments.{name}", description=doc.split("\n")[0])
    p.add_argument("--out", default=os.path.join("runs", name), help="output folder (default: runs/%(prog)s)")
    p.add_argument("--tiny", action="store_true", help="a few steps only (for tests)")
    p.add_argument("--seed", type=int, default=0)
    return p


def load_digits_tensors(seed=0, test_fraction=0.2, scaling="unit"):
    """Digits as ``([N, 1, 8, 8] float32, labels)`` train and test splits.

    Args:
        seed: seed of the train/test split.
        test_fraction: fraction of the 1,797 images held out.
        scaling: ``"unit"`` (pixel / 16, in [0, 1], as ``cockpit_lite.demo``),
            ``"standard"`` (zero mean, unit variance over all training pixels) or
            ``"raw255"`` (pixel / 16 * 255, the 0..255 range of an image file that
            was never normalised).
    """
    if scaling not in SCALINGS:
        raise ValueError(f"unknown scaling {scaling!r}; choose one of {SCALINGS}")
    (train, train_labels), (test, test_labels) = demo.load_digits_tensors(seed, test_fraction)
    if scaling == "standard":
        mean, std = train.mean(), train.std()
        train, test = (train - mean) / std, (test - mean) / std
    elif scaling == "raw255":
        train, test = train * 255.0, test * 255.0
    return (train, train_labels), (test, test_labels)


def mlp(widths, activation=nn.ReLU, n_in=64, n_out=10):
    """``Flatten → Linear → act → … → Linear`` with hidden ``widths`` (no in-place ops)."""
    layers, d = [nn.Flatten()], n_in
    for w in widths:
        layers += [nn.Linear(d, w), activation()]
        d = w
    layers.append(nn.Linear(d, n_out))
    return nn.Sequential(*layers)


def kaiming(model):
    """``model`` with Kaiming-normal weights (fan-in, ReLU gain; He et al. 2015) and zero biases in every Linear layer."""
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)
    return model


def finite(values):
    """The finite entries of ``values`` (None/NaN/Inf dropped) as a float array."""
    out = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return np.asarray(out, dtype=float)


def median(values):
    """Median of the finite entries, NaN when there are none."""
    v = finite(values)
    return float(np.median(v)) if v.size else float("nan")


def rounded(value, digits=4):
    """``value`` with ``digits`` significant digits (None for None/NaN/Inf), for compact JSON."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def jsonable(obj):
    """Strict-JSON version of ``obj``: numpy to lists, NaN/Inf to None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def write_json(path, obj):
    """Write ``obj`` as strict JSON (NaN/Inf become ``null``); return the path."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    text = json.dumps(jsonable(obj), indent=1, allow_nan=False)
    with open(path, "w", encoding="utf-8") as file:
        file.write(compact_json_text(text) + "\n")
    return path


def report(out, name, summary):
    """Write ``summary`` to ``OUT/NAME.json``, print where the figure and numbers are, return it."""
    path = write_json(os.path.join(out, f"{name}.json"), summary)
    print(f"figure: {summary['figure']}\nnumbers: {path}")
    return summary


def new_figure(width, height):
    """A pyplot-free ``Figure`` (safe headless and in threads), constrained layout."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def save_figure(fig, path):
    """Save ``fig`` as PNG; return the path."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def histogram_stats(hist):
    """``(n, clipped fraction, binned std)`` of a record histogram ``{"hist", "edges", "clipped"}``."""
    counts = np.asarray(hist["hist"], dtype=float)
    edges = np.asarray(hist["edges"], dtype=float)
    n = counts.sum()
    if n <= 0:
        return 0, float("nan"), float("nan")
    centres = 0.5 * (edges[1:] + edges[:-1])
    mean = (counts * centres).sum() / n
    std = math.sqrt(max((counts * (centres - mean) ** 2).sum() / n, 0.0))
    return int(n), float(hist.get("clipped", 0) or 0) / n, std


def rms_individual_gradient(grad_norm, grad_variance, numel, batch_size):
    """Root mean square of the individual-gradient elements ``g_{n,d}`` of one tensor, exactly.

    From the record's ``GradNorm`` (‖g‖, ``g = mean_n g_n``) and ``GradVariance``
    (``Σ_d σ̂_d²`` with the unbiased per-coordinate variance over the batch):
    ``mean_{n,d} g_{n,d}² = ( (B−1)/B · Σ_d σ̂_d² + ‖g‖² ) / D``.
    """
    second_moment = ((batch_size - 1) / batch_size * grad_variance + grad_norm**2) / numel
    return math.sqrt(max(second_moment, 0.0))


def compact_json_text(text):
    """Put JSON arrays of plain numbers (and nulls) on one line (``json.dumps(indent=...)`` does not)."""
    import re

    item = r"(?:-?[0-9][0-9.eE+-]*|null|true|false)"
    pattern = re.compile(rf"\[\s*({item}(?:,\s*{item})*)\s*\]")
    return pattern.sub(lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
