"""The record: the only thing that crosses from collection to rendering.

This module defines the record format (version ``FORMAT_VERSION``); the package
``cockpit_lite.log`` reads and writes it. It imports neither torch nor any other part of ``cockpit_lite``, so the
``instruments`` package can depend on it alone.

In memory
---------
A record is ``{step: {key: value}}`` with integer steps. Keys are

- quantity class names (``"Loss"``, ``"GradNorm"``, ``"Alpha"``, ...) whose value has
  the layout of the original Cockpit:

  * scalars as Python ``float`` (``nan`` where a value could not be computed);
  * per-parameter quantities (``GradNorm``, ``Distance``, ``UpdateSize``,
    ``HessTrace``, ``GradVariance``) as a ``list`` of floats in parameter order;
  * histograms as ``{"hist": ndarray, "edges": ndarray}`` (1-d) or
    ``{"hist": ndarray, "edges": [ndarray, ndarray]}`` (2-d), plus the integer
    counts ``"clipped"`` (values outside the range, counted in the edge bins) and
    ``"nonfinite"`` (NaN/Inf values, not counted);

- ``"layers"``: ``{quantity name: list}``, the per-layer (per parameter tensor) value
  of every quantity whose main value is not already a per-parameter list;
- ``"flags"``: a list of strings naming what went wrong at this step (for example
  ``"nonfinite_loss"``), absent when nothing did;
- ``"batch"``: ``{"size": B, "accumulated": bool, "passes": k}`` at steps with
  individual-gradient statistics: the number of samples they describe; whether the
  optimizer's gradient also holds backward passes the Cockpit did not track (``cp(step)``
  around the last micro-batch only; then every quantity of the step describes that
  micro-batch alone); and the number of tracked backward passes, the micro-batches of
  ``Cockpit(accumulate=True)``, which the statistics describe together (older logs have
  no ``"passes"``); at a subsampled step (``Cockpit(samples=k)``) also ``"samples": k``,
  the number of samples the per-sample quantities were estimated from;
- ``"meta"``: ``{quantity name: dict}``, how a value was obtained, where it matters
  for reading it: the curvature quantities (``HessTrace``, ``TICDiag``, ``TICTrace``)
  record ``{"curvature": method}`` with method ``"diag_h"``, ``"diag_ggn_exact"``,
  ``"diag_ggn_mc"`` (BackPACK, exact or Monte-Carlo) or ``"hutchinson"`` (an estimate
  from Hessian-vector products, then also ``"probes"``: the number of probe vectors,
  ``"se"``: the standard error of the value, ``"layers_se"``: those of the
  per-layer values, and ``"df"``: their degrees of freedom), or ``None`` (a TIC without an exact diagonal: NaN with a flag); ``HessMaxEV`` records ``{"solver": "lanczos" | "power",
  "products": k}``; a per-sample quantity estimated from a subsample (``Cockpit(samples=k)``,
  ``cockpit_lite.subsample``) records ``{"samples": k, "of": B, "se": ..., "layers_se":
  [...], "df": k − 1}``, and ``"scale": "log"`` where its interval is formed on the log
  scale (``cockpit_lite.intervals``; ``GradVariance``: ``"se"`` a list in parameter order
  and ``"total_se"`` that of the sum; histograms: ``"se": None``; ``Alpha``: its own
  ``"interval": [low, high]`` at ``"coverage"``, and Welch-Satterthwaite ``"df"``; older
  logs have no ``"df"``);
- ``"budget"``: at each step where an overhead budget made a plan (see ``cockpit_lite.budget``):
  ``{"version": 2, "factor", "horizon", "origin", "step", "plain_step_s", "untracked_s",
  "untracked_cost", "tiers": {name: 0 | 1 | 2}, "costs": {tier: plain steps}, "measured":
  {tier: bool}, "shares", "accounts", "pending", "candidates": {tier: "every" | m},
  "recalibrate": step | None, "spent", "average", "fired": {tier: steps}, "bought": {tier:
  [names]}}``; the plans of a run replay its schedules (``Budget(plan=budget.plans(record))``);
- ``"findings"``: a list of dicts (``cockpit_lite.diagnosis.Finding.to_dict()``: kind,
  layer, step, severity, message, suggestion, evidence), at the step where each finding
  was first seen, written by the live diagnosis (``diagnose=True``);
- the epoch-level keys written by ``Cockpit.log`` (``EPOCH_KEYS``).

Individual gradients
--------------------
Sample n's individual gradient is ``g̃_n = B · ∇_θ c_n``, where ``c_n`` is sample n's
term of the reduced loss (``Σ_n c_n = L``: ``ℓ_n / B`` for ``reduction="mean"``, ``ℓ_n``
for ``"sum"``) and the derivative goes through the whole graph: with BatchNorm in
training mode it includes the path through the batch statistics. Hence
``g = mean_n g̃_n`` on every model. A sample is one index of the batch axis; a
sequence model's token losses are summed per sequence.

On disk
-------
*JSON lines* (``.jsonl``): a log holds one or more *run segments*. A segment starts
with a header line ``{"format": "cockpit-lite", "version": 1, "run": id, "started":
ISO time, "params": [{"name", "shape"}, ...], "quantities": [...]}``; every further
line is ``{"step": s, key: value, ...}`` and is merged into the record at step ``s``
(two-step quantities such as ``Alpha`` are known one step later and arrive in a
later line). Lines are appended and flushed as each step ends, so a crash loses at
most the step in flight; a reader skips the torn last line of a segment and warns
once. A new ``JSONLinesWriter`` (a new ``Cockpit(log=path)``) on an existing log
never truncates it: it appends a new segment with a new run id. A header that
repeats the previous segment's run id (a resumed run, ``JSONLinesWriter(...,
run=id)``) continues that segment; so does one marked ``"resumed": true`` that repeats
an earlier segment's id (other runs appended in between), and its ``"resumed_after": s``
drops what that segment held at steps after ``s`` (a run resumed from its checkpoint at
step ``s`` records the later steps again; ``Cockpit.load_state_dict`` writes such a
header, see "Resuming a run" in the README). Readers return the last segment by default
(``read(path)``, ``read_jsonl(path)``), any other with ``segment=i`` (an index as for
a list, or a run id) and all of them with ``segment="all"``; ``segments(path)`` lists
the headers. Logs written before segments existed (a header without ``"run"``) read
as before. See ``docs/logs.md``.

A failing write (``OSError``: a full disk, a lost network mount) never stops
training: the writer warns once, keeps the unwritten lines in memory and writes
them, in order, at the next step; ``strict=True`` raises instead. ``close`` writes
what it can and ``fsync``s the file.

*JSON* (``.json``): ``{str(step): {key: value}}``, the layout of Cockpit's
``write`` (quantity class names as keys), written by ``Cockpit.write``. Arrays in it
are encoded as json_tricks encodes them (``{"__ndarray__": [...], "dtype": ...,
"shape": [...]}``), so that the original Cockpit's ``CockpitPlotter`` reads the file;
``read_json`` reads such files written by the original Cockpit too (also
json_tricks' compact ``"b64:"`` / ``"b64.gz:"`` array strings).

Values on disk are plain JSON; non-finite floats are written as ``NaN`` /
``Infinity`` (Python's JSON dialect) and histogram arrays in the JSON-lines log as
nested lists.

Reading untrusted files
-----------------------
Every reader validates as it reads: a line (or a ``.json`` file or step) that is not
a record raises one ``RecordError`` (a ``ValueError``) naming the file, the line (or
step) and the field. Nothing in a file selects code (arrays are numbers only). Sizes
are bounded by ``LIMITS`` (``max_line_bytes``, ``max_file_bytes``, ``max_items``,
``max_array_bytes``, ``max_depth``); a file beyond one raises ``RecordError`` naming
the limit. For a file you trust, raise it for one call (``read(path,
limits={"max_array_bytes": 2**31})``) or for the process
(``cockpit_lite.log.LIMITS["max_array_bytes"] = 2**31``); on the command line
``python -m instruments --limit max_array_bytes=2147483648 RUN.jsonl``.
"""

import math

import numpy as np


FORMAT = "cockpit-lite"
FORMAT_VERSION = 1

LAYERS = "layers"
FLAGS = "flags"
BATCH = "batch"
META = "meta"
BUDGET = "budget"
FINDINGS = "findings"
EPOCH_KEYS = (
    "epoch_count",
    "train_loss",
    "valid_loss",
    "test_loss",
    "train_accuracy",
    "valid_accuracy",
    "test_accuracy",
    "learning_rate",
)
RESERVED_KEYS = (LAYERS, FLAGS, BATCH, META, BUDGET, FINDINGS) + EPOCH_KEYS


def layer_values(entry, name):
    """Return the per-layer values of quantity ``name`` in a step's ``entry``.

    Args:
        entry: one step of a record, ``record[step]``.
        name: quantity class name.

    Returns:
        A list with one value per tracked parameter tensor, or ``None`` when the
        quantity has no per-layer value at this step.
    """
    layers = entry.get(LAYERS, {})
    if name in layers:
        return layers[name]
    value = entry.get(name)
    if isinstance(value, list):
        return value
    return None


def merge(record, step, entries):
    """Merge ``entries`` (a dict of keys to values) into ``record[step]``.

    ``"layers"`` and ``"meta"`` dicts are merged key by key and ``"flags"`` and ``"findings"`` lists are concatenated,
    so that values of one step arriving in several parts combine.
    """
    target = record.setdefault(int(step), {})
    for key, value in entries.items():
        if key in (LAYERS, META):
            target.setdefault(key, {}).update(value)
        elif key in (FLAGS, FINDINGS):
            target.setdefault(key, []).extend(f for f in value if f not in target.get(key, []))
        else:
            target[key] = value


def to_jsonable(value, tagged_arrays=False):
    """Convert a record value (numpy arrays, numpy scalars, nesting) to plain JSON types.

    Args:
        value: a record value.
        tagged_arrays: encode arrays as json_tricks does, ``{"__ndarray__": list,
            "dtype": str, "shape": list}`` (what Cockpit's plotter reads), instead of
            as nested lists.
    """
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, tagged_arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, tagged_arrays) for v in value]
    if isinstance(value, np.ndarray):
        if tagged_arrays:
            tagged = {"__ndarray__": value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
            if value.ndim > 1:
                tagged["Corder"] = True  # tolist() is in C order whatever the memory layout
            return tagged
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def is_finite_number(value):
    """Whether ``value`` is a real, finite number (not None, NaN or Inf)."""
    return isinstance(value, (int, float, np.number)) and math.isfinite(float(value))
