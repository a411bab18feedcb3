"""LR range test gauge: the loss over an exponential learning-rate sweep, suggestion marked.

Draws what ``cockpit_lite.checks.lr_range_test`` measured (Smith 2017): light dots
the loss of each step, the bold line its exponentially smoothed version, both
against the learning rate on a log axis; a vertical line marks the suggested
learning rate (rule in the legend, "min/10" by default) and a dot the minimum of
the smoothed loss. The y axis is cut a little above the smoothed loss at the
start, so that the divergence at the end does not squash the curve.

How to read it
- A long flat start (too small rates), a descent, a minimum, then a steep rise.
- The suggestion should sit on the descent, left of the minimum; a suggestion
  near the right edge with no rise after it means the sweep ended too early.
- No descent at all: the model does not learn at any rate (see the pre-flight
  checks ``overfit_one_batch`` and ``nonzero_gradients``).

Plain data only (no torch): ``gauge`` takes the result's ``to_dict()`` (lists
``lr``, ``loss``, ``smoothed_loss`` and ``suggested_lr``, ``min_lr``, ``rule``), the
result itself, or the path of its CSV (``result.to_csv(path)``, read by
``read_csv``). It is not part of the training dashboard: the sweep happens
before training, not at its steps.
"""

import csv
import math

import numpy as np

from .. import style

TITLE = "LR range test"
KEYS = ("lr", "loss", "smoothed_loss")


def read_csv(path):
    """The dict of an LR range test CSV written by ``LRRangeResult.to_csv``."""
    record = {"lr": [], "loss": [], "smoothed_loss": []}
    header = {}
    with open(path, newline="", encoding="utf-8") as file:
        lines = []
        for line in file:
            if line.startswith("#"):
                key, _, value = line[1:].strip().partition(": ")
                header[key] = value
            else:
                lines.append(line)
    for row in csv.DictReader(lines):
        for key in KEYS:
            record[key].append(float(row[key]))
    for key in ("suggested_lr", "min_lr"):
        value = header.get(key, "None")
        record[key] = None if value == "None" else float(value)
    record["diverged"] = header.get("diverged") == "True"
    record["rule"] = header.get("rule", "")
    return record


def _plain(source):
    if isinstance(source, str) or hasattr(source, "__fspath__"):
        return read_csv(source)
    if hasattr(source, "to_dict"):
        return source.to_dict()
    return source


def gauge(record, ax, **options):
    """Draw the LR range curve on ``ax`` from a result, its ``to_dict()`` or its CSV path."""
    record = _plain(record)
    if not all(record.get(k) for k in KEYS):
        style.set_title(ax, TITLE)
        style.note(ax, "no LR range test\n(cockpit_lite.checks.lr_range_test)")
        return
    lr = np.asarray(record["lr"], float)
    loss = np.asarray(record["loss"], float)
    smooth = np.asarray(record["smoothed_loss"], float)
    ax.plot(lr, loss, linestyle="none", marker="o", markersize=2.5, markeredgewidth=0, alpha=0.45,
            color=style.PRIMARY, label="loss")
    ax.plot(lr, smooth, color=style.PRIMARY, linewidth=1.8, label="smoothed loss")
    suggested, lowest = record.get("suggested_lr"), record.get("min_lr")
    if lowest is not None:
        at = int(np.argmin(np.abs(np.log(lr) - math.log(lowest))))
        ax.plot([lowest], [smooth[at]], marker="o", color=style.REFERENCE, markersize=5, linestyle="none",
                label=f"minimum at {style.fmt(lowest)}")
    if suggested is not None:
        ax.axvline(suggested, color=style.SECONDARY, linewidth=1.6,
                   label=f"suggested {style.fmt(suggested)} ({record.get('rule', '').split(':')[0]})")
    ax.set_xscale("log")
    finite = smooth[np.isfinite(smooth)]
    raw = loss[np.isfinite(loss)]
    if finite.size:
        low = min(float(finite.min()), float(raw.min()) if raw.size else float(finite.min()))
        high = 1.25 * float(finite[0])
        ax.set_ylim(low - 0.05 * (high - low), high)
    style.style_axes(ax, xlabel="learning rate", ylabel="loss")
    style.legend(ax, loc="lower left")
    title = TITLE + (f" · suggested lr {style.fmt(suggested)}" if suggested is not None else " · no suggestion")
    style.set_title(ax, title)
