"""The record: the only thing that crosses from collection to rendering.

This module defines the record format (version ``FORMAT_VERSION``) and reads and
writes it. It imports neither torch nor any other part of ``cockpit_lite``, so the
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
- ``"batch"``: ``{"size": B, "accumulated": bool}`` at steps with individual-gradient
  statistics: the number of samples they describe, and whether the optimizer's
  gradient also holds earlier backward passes (gradient accumulation; then every
  quantity of the step describes this backward pass's micro-batch alone);
- ``"meta"``: ``{quantity name: dict}``, how a value was obtained, where it matters
  for reading it: the curvature quantities (``HessTrace``, ``TICDiag``, ``TICTrace``)
  record ``{"curvature": method}`` with method ``"diag_h"``, ``"diag_ggn_exact"``,
  ``"diag_ggn_mc"`` (BackPACK, exact or Monte-Carlo) or ``"hutchinson"`` (an estimate
  from Hessian-vector products, then also ``"probes"``: the number of probe vectors,
  ``"se"``: the standard error of the value, and ``"layers_se"``: those of the
  per-layer values); ``HessMaxEV`` records ``{"solver": "lanczos" | "power",
  "products": k}``;
- ``"budget"``: at the step where an overhead budget fixed the schedules (see
  ``cockpit_lite.budget``): ``{"factor", "horizon", "plain_step_s", "tiers": {name:
  0 | 1 | 2}, "costs": {tier: marginal cost in plain steps}, "calibration_cost",
  "schedules": {name: {"every": 1, "from": t} | {"per_octave": m, "from": t}},
  "expected_ratio", "calibrated_at": {name: [steps]}}``; enough to replay the run's
  schedule (``Budget(plan=...)``);
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
*JSON lines* (``.jsonl``): the first line is a header
``{"format": "cockpit-lite", "version": 1, "params": [{"name", "shape"}, ...],
"quantities": [...]}``; every further line is ``{"step": s, key: value, ...}`` and is
merged into the record at step ``s`` (two-step quantities such as ``Alpha`` are
known one step later and arrive in a later line). Lines are appended and flushed as
each step ends, so a crash loses at most the step in flight; ``read`` skips a torn
last line and warns once.

*JSON* (``.json``): ``{str(step): {key: value}}``, the layout of Cockpit's
``write`` (quantity class names as keys), written by ``Cockpit.write``. Arrays in it
are encoded as json_tricks encodes them (``{"__ndarray__": [...], "dtype": ...,
"shape": [...]}``), so that the original Cockpit's ``CockpitPlotter`` reads the file;
``read_json`` reads such files written by the original Cockpit too (also
json_tricks' compact ``"b64:"`` / ``"b64.gz:"`` array strings).

Values on disk are plain JSON; non-finite floats are written as ``NaN`` /
``Infinity`` (Python's JSON dialect) and histogram arrays in the JSON-lines log as
nested lists.
"""

import base64
import gzip
import json
import math
import os
import warnings

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


def _tagged_array(tagged):
    """The array of a json_tricks ``{"__ndarray__": ...}`` dict (list or ``b64[.gz]:`` data)."""
    data, dtype = tagged["__ndarray__"], np.dtype(tagged.get("dtype", "float64"))
    shape = tuple(tagged.get("shape", ()))
    order = "C" if tagged.get("Corder", True) else "F"
    if isinstance(data, str):
        prefix, _, payload = data.partition(":")
        if prefix not in ("b64", "b64.gz"):
            raise ValueError(f"unknown json_tricks array encoding {prefix!r} (expected b64 or b64.gz)")
        raw = base64.standard_b64decode(payload)
        if prefix == "b64.gz":
            raw = gzip.decompress(raw)
        if tagged.get("endian") in ("little", "big"):
            dtype = dtype.newbyteorder("<" if tagged["endian"] == "little" else ">")
        return np.frombuffer(raw, dtype=dtype).reshape(shape, order=order).copy()
    if order == "F":  # json_tricks lists a Fortran-ordered array's transpose
        return np.asarray(data, dtype=dtype).reshape(shape[::-1]).T.copy()
    return np.asarray(data, dtype=dtype).reshape(shape)


def from_jsonable(value):
    """Inverse of ``to_jsonable`` for the record layout: histograms become arrays.

    json_tricks' ``{"__ndarray__": ...}`` dicts (Cockpit's ``write``) become arrays
    wherever they are.
    """
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return _tagged_array(value)
        out = {k: from_jsonable(v) for k, v in value.items()}
        if "hist" in out:
            out["hist"] = np.asarray(out["hist"])
            edges = out.get("edges")
            if edges is not None:
                if isinstance(edges, list) and len(edges) and np.ndim(edges[0]) == 1:
                    out["edges"] = [np.asarray(e, dtype=float) for e in edges]
                else:
                    out["edges"] = np.asarray(edges, dtype=float)
        return out
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value


class JSONLinesWriter:
    """Append one JSON line per step part to ``path`` and flush it immediately."""

    def __init__(self, path, header):
        """Create (truncate) ``path`` and write the header line.

        Args:
            path: file to write; its folder is created if needed.
            header: dict merged into ``{"format": ..., "version": ...}``.
        """
        self.path = os.fspath(path)
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")
        self._write({"format": FORMAT, "version": FORMAT_VERSION, **header})

    def append(self, step, entries):
        """Append the ``entries`` of ``step`` as one line."""
        self._write({"step": int(step), **to_jsonable(entries)})

    def _write(self, obj):
        self._file.write(json.dumps(obj) + "\n")
        self._file.flush()

    def close(self):
        """Close the file; later appends raise."""
        self._file.close()


def read_jsonl(path):
    """Read a JSON-lines log into ``(header, record)``.

    A last line that does not parse (a run that crashed while writing it) is
    skipped with one warning; a bad line elsewhere raises ``ValueError`` with its
    line number.
    """
    with open(path, encoding="utf-8") as file:
        lines = file.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    header, record = {}, {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                warnings.warn(
                    f"{path}: last line ({number}) is incomplete (the run probably "
                    "stopped while writing it); it was skipped.",
                    stacklevel=2,
                )
                break
            raise ValueError(f"{path}: line {number} is not valid JSON: {error}") from error
        if "format" in obj and "step" not in obj:
            if obj.get("format") != FORMAT:
                raise ValueError(f"{path}: not a {FORMAT} log (format={obj.get('format')!r})")
            if obj.get("version", 0) > FORMAT_VERSION:
                raise ValueError(
                    f"{path}: log format version {obj['version']} is newer than this "
                    f"reader ({FORMAT_VERSION}); update cockpit-lite"
                )
            header = obj
            continue
        step = obj.pop("step")
        merge(record, step, from_jsonable(obj))
    return header, record


def write_json(path, record):
    """Write ``record`` as one JSON file in Cockpit's output layout."""
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    data = {str(step): to_jsonable(entry, tagged_arrays=True) for step, entry in sorted(record.items())}
    with open(path, "w", encoding="utf-8") as file:
        json.dump(data, file, indent=1)


def read_json(path):
    """Read a JSON file written by ``write_json`` (or by Cockpit) into a record."""
    with open(path, encoding="utf-8") as file:
        data = json.load(file)
    return {int(step): from_jsonable(entry) for step, entry in data.items()}


def read(source):
    """Return the record held by ``source``: a record dict, a ``.jsonl`` or a ``.json`` path."""
    if isinstance(source, dict):
        return source
    path = os.fspath(source)
    if path.endswith(".jsonl"):
        return read_jsonl(path)[1]
    return read_json(path)


def is_finite_number(value):
    """Whether ``value`` is a real, finite number (not None, NaN or Inf)."""
    return isinstance(value, (int, float, np.number)) and math.isfinite(float(value))
