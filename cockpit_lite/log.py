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

import base64
import collections
import errno
import json
import math
import os
import time
import warnings
import zlib

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


#: Bounds on what a reader accepts from a file (see "Reading untrusted files" above).
#: Change an entry to change the default of every reader in this process.
LIMITS = {
    "max_line_bytes": 64 * 2**20,   # one line of a .jsonl log
    "max_file_bytes": 2**30,        # a whole .json file (read at once)
    "max_items": 2**22,             # list/dict elements in one step's values (4,194,304)
    "max_array_bytes": 64 * 2**20,  # one decoded json_tricks array (b64 / b64.gz / list)
    "max_depth": 64,                # nesting of lists and dicts in one line / step
}

#: Record keys whose value is a number (or ``None``): Cockpit's scalar quantities.
SCALAR_KEYS = ("Loss", "Alpha", "NormTest", "InnerTest", "OrthoTest", "MeanGSNR", "TICDiag", "TICTrace",
               "HessMaxEV", "CABS", "EarlyStopping", "Time")
#: Record keys whose value is a list of numbers, one per parameter tensor.
PER_PARAMETER_KEYS = ("GradNorm", "Distance", "UpdateSize", "HessTrace", "GradVariance", "ParamNorm")
#: Record keys whose value is a histogram dict.
HISTOGRAM_KEYS = ("GradHist1d", "GradHist2d")


class RecordError(ValueError):
    """A file (or one of its lines) that is not a cockpit-lite record, or one beyond ``LIMITS``.

    The message names the file, the line (or the step of a ``.json`` file) and the field.
    """


class _FieldError(ValueError):
    """A problem inside one value; the reader adds the file and the line."""

    def __init__(self, field, message):
        super().__init__(message)
        self.field = field
        self.message = message


def _limits(limits):
    """``LIMITS`` updated by ``limits`` (a dict; unknown names are refused)."""
    out = dict(LIMITS)
    if limits:
        unknown = set(limits) - set(LIMITS)
        if unknown:
            raise ValueError(f"unknown reader limit(s) {sorted(unknown)}; known: {sorted(LIMITS)}")
        out.update(limits)
    return out


def _too_big(name, limits):
    """The end of a message about a value beyond ``LIMITS[name]``: the limit and how to raise it."""
    return (f"the limit {name}={limits[name]:,}; for a file you trust, raise it: limits={{'{name}': N}} "
            f"(cockpit_lite.log.LIMITS['{name}'] = N, or python -m instruments --limit {name}=N)")


def _field_name(field):
    return ".".join(str(k) for k in field) if field else None


def _where(path, line=None, step=None, field=None):
    parts = [os.fspath(path)]
    if line is not None:
        parts.append(f"line {line}")
    if step is not None:
        parts.append(f"step {step!r}")
    if field:
        parts.append(f"field {_field_name(field)!r}")
    return ", ".join(parts)


def _shape(tagged):
    shape = tagged.get("shape")
    if shape is None:
        return None
    if not isinstance(shape, list) or len(shape) > 32 or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"array shape must be a list of at most 32 non-negative integers, got {shape!r}"[:300])
    return tuple(shape)


def _tagged_array(tagged, limits=None):
    """The array of a json_tricks ``{"__ndarray__": ...}`` dict (list or ``b64[.gz]:`` data).

    Only numeric dtypes are accepted, and the decoded size is bounded by
    ``max_array_bytes`` before anything is decoded or decompressed.
    """
    limits = _limits(limits)
    data, dtype = tagged["__ndarray__"], tagged.get("dtype", "float64")
    if not isinstance(dtype, str):
        raise ValueError(f"array dtype must be a string, got {type(dtype).__name__}")
    try:
        dtype = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as error:
        raise ValueError(f"unknown array dtype {dtype[:40]!r}") from error
    if dtype.kind not in "biufc" or dtype.shape != () or dtype.names is not None:
        raise ValueError(f"array dtype {str(dtype)[:40]!r} is not a number type (bool, int, uint, float, complex)")
    shape = _shape(tagged)
    order = "C" if tagged.get("Corder", True) else "F"
    if isinstance(data, str):
        if shape is None:
            raise ValueError("an encoded (b64) array needs its 'shape'")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > limits["max_array_bytes"]:
            raise ValueError(f"array of shape {list(shape)} ({dtype}) takes {nbytes:,} bytes, more than "
                             + _too_big("max_array_bytes", limits))
        prefix, _, payload = data.partition(":")
        if prefix not in ("b64", "b64.gz"):
            raise ValueError(f"unknown json_tricks array encoding {prefix[:20]!r} (expected b64 or b64.gz)")
        if len(payload) > 2 * limits["max_array_bytes"] + 1024:
            raise ValueError(f"encoded array of {len(payload):,} characters, more than twice "
                             + _too_big("max_array_bytes", limits))
        try:
            raw = base64.b64decode(payload, validate=True)
        except ValueError as error:
            raise ValueError(f"array data is not valid base64 ({error})") from error
        if prefix == "b64.gz":
            inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
            try:
                raw = inflater.decompress(raw, nbytes + 1)  # never more than the shape says, plus one byte
            except zlib.error as error:
                raise ValueError(f"array data does not decompress ({error})") from error
        if len(raw) != nbytes:
            held = f"more than {nbytes:,}" if len(raw) > nbytes else f"{len(raw):,}"
            raise ValueError(f"array data holds {held} bytes, its shape {list(shape)} and dtype {dtype} "
                             f"need {nbytes:,}")
        if tagged.get("endian") in ("little", "big"):
            dtype = dtype.newbyteorder("<" if tagged["endian"] == "little" else ">")
        return np.frombuffer(raw, dtype=dtype).reshape(shape, order=order).copy()
    if not isinstance(data, list):
        raise ValueError(f"array data must be a list or a b64 string, got {type(data).__name__}")
    try:
        array = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"array data is not a regular array of {dtype} ({error})"[:300]) from error
    if array.nbytes > limits["max_array_bytes"]:
        raise ValueError(f"array of {array.nbytes:,} bytes, more than " + _too_big("max_array_bytes", limits))
    if shape is None:
        return array
    if array.size != math.prod(shape):
        raise ValueError(f"array data holds {array.size} values, its shape {list(shape)} needs {math.prod(shape)}")
    return array.reshape(shape)  # a list is in logical order ("Corder": false only described the memory)


def _numeric_array(value, field):
    """``value`` as an array of numbers (float for edges), refusing ragged or non-numeric data."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise _FieldError(field, f"expected a regular array of numbers ({error})"[:300]) from error
    if array.dtype.kind not in "biuf" and not (array.dtype.kind == "O" and array.size == 0) or array.ndim == 0:
        raise _FieldError(field, f"expected an array of numbers, got {str(value)[:60]!r}")
    return array


_CONTAINERS = (dict, list)


def _decode(value, limits, field, depth=1, budget=None):
    """Decode one parsed value: tagged arrays and histograms become arrays, sizes are checked.

    Refuses values nested deeper than ``max_depth`` or holding more than ``max_items``
    list and dict elements in all (``budget``: the elements left). The recursion is
    bounded by ``max_depth``, so no nesting makes it overflow the stack.
    """
    if not isinstance(value, _CONTAINERS):
        return value
    if budget is None:
        budget = [limits["max_items"]]
    if depth > limits["max_depth"]:
        raise _FieldError(field, "values nested deeper than " + _too_big("max_depth", limits))
    budget[0] -= len(value)
    if budget[0] < 0:
        raise _FieldError(field, "more list and dict elements in one step than " + _too_big("max_items", limits))
    if isinstance(value, list):
        if set(map(type, value)).isdisjoint(_CONTAINERS):  # numbers and strings: nothing to decode
            return value
        return [_decode(v, limits, field, depth + 1, budget) for v in value]
    if "__ndarray__" in value:
        try:
            return _tagged_array(value, limits)
        except ValueError as error:
            raise _FieldError(field, str(error)) from error
    out = {k: _decode(v, limits, field + (k,) if len(field) < 3 else field, depth + 1, budget)
           for k, v in value.items()}
    if "hist" in out:
        out["hist"] = _numeric_array(out["hist"], field + ("hist",))
        edges = out.get("edges")
        if edges is not None:
            if isinstance(edges, list) and len(edges) and np.ndim(edges[0]) == 1:
                out["edges"] = [_numeric_array(e, field + ("edges",)).astype(float) for e in edges]
            else:
                out["edges"] = _numeric_array(edges, field + ("edges",)).astype(float)
    return out


def from_jsonable(value, limits=None):
    """Inverse of ``to_jsonable`` for the record layout: histograms become arrays.

    json_tricks' ``{"__ndarray__": ...}`` dicts (Cockpit's ``write``) become arrays
    wherever they are, bounded by ``limits`` (default ``LIMITS``).

    Raises:
        ValueError: for an array that is not numeric, ragged or beyond the limits.
    """
    limits = _limits(limits)
    try:
        return _decode(value, limits, ())
    except _FieldError as error:
        raise ValueError(f"field {_field_name(error.field)!r}: {error.message}" if error.field else error.message)


# ----------------------------------------------------------------------------- validation


def _is_number(value):
    return isinstance(value, (int, float)) and (not isinstance(value, int) or abs(value) < 2**1023)


def _is_integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _expect(condition, field, expected, value):
    if not condition:
        shown = json.dumps(value, default=str)[:60] if not isinstance(value, np.ndarray) else "an array"
        raise _FieldError(field, f"expected {expected}, got {shown}")


def _number_or_none(value, field):
    _expect(value is None or _is_number(value), field, "a number or null", value)


def _check_finding(finding, field):
    _expect(isinstance(finding, dict), field, "a finding (a dict)", finding)
    for key in ("kind", "severity", "message"):
        _expect(isinstance(finding.get(key), str), field + (key,), "a string", finding.get(key))
    for key in ("layer", "suggestion"):
        _expect(finding.get(key) is None or isinstance(finding[key], str), field + (key,), "a string or null",
                finding.get(key))
    _expect(_is_integer(finding.get("step")), field + ("step",), "an integer", finding.get("step"))
    _expect(finding.get("evidence") is None or isinstance(finding["evidence"], dict), field + ("evidence",),
            "a dict or null", finding.get("evidence"))


def check_entry(entry, field=()):
    """Raise ``ValueError`` unless ``entry`` (one decoded step of a record) has the record's layout.

    The reserved keys and the quantities drawn by ``instruments`` and read by the
    diagnosis are checked (``SCALAR_KEYS``, ``PER_PARAMETER_KEYS``, ``HISTOGRAM_KEYS``,
    ``ActivationStats``, ``InputStats``); other keys (custom quantities) may hold any
    JSON value. The error names the field.
    """
    _expect(isinstance(entry, dict), field, "a step record (a JSON object)", entry)
    for key, value in entry.items():
        where = field + (key,)
        if key in SCALAR_KEYS:
            _number_or_none(value, where)
        elif key in EPOCH_KEYS:
            _expect(value is None or _is_number(value) or (isinstance(value, list) and all(
                v is None or _is_number(v) for v in value)), where, "a number, null or a list of numbers", value)
        elif key in PER_PARAMETER_KEYS:
            _expect(isinstance(value, (list, np.ndarray)), where, "a list of numbers (one per parameter)", value)
            if isinstance(value, list):
                for item in value:
                    _number_or_none(item, where)
        elif key in HISTOGRAM_KEYS:
            _expect(isinstance(value, dict) and isinstance(value.get("hist"), np.ndarray), where,
                    "a histogram {'hist': [...], 'edges': [...]}", value)
        elif key == FLAGS:
            _expect(isinstance(value, list) and all(isinstance(f, str) for f in value), where,
                    "a list of strings", value)
        elif key == FINDINGS:
            _expect(isinstance(value, list), where, "a list of findings", value)
            for finding in value:
                _check_finding(finding, where)
        elif key == LAYERS:
            _expect(isinstance(value, dict), where, "a dict {quantity: per-layer list}", value)
            for name, values in value.items():
                _expect(isinstance(values, list), where + (name,), "a list (one value per parameter)", values)
                for item in values:
                    _expect(item is None or _is_number(item) or isinstance(item, (dict, list)), where + (name,),
                            "numbers or histograms", item)
        elif key in (META, BUDGET):
            _expect(isinstance(value, dict), where, "a dict", value)
        elif key == BATCH:
            _expect(isinstance(value, dict), where, "a dict {'size': B, 'accumulated': bool, 'passes': k}", value)
            if "size" in value:
                _number_or_none(value["size"], where + ("size",))
        elif key == "ActivationStats":
            _expect(isinstance(value, dict), where, "a dict {module: statistics}", value)
            for module, stats in value.items():
                _expect(isinstance(stats, dict), where + (module,), "a dict of statistics", stats)
                for name, stat in stats.items():
                    _expect(stat is None or _is_number(stat) or isinstance(stat, str), where + (module, name),
                            "a number, a string or null", stat)
        elif key == "InputStats":
            _expect(isinstance(value, dict), where, "a dict of statistics", value)
            for name, stat in value.items():
                _number_or_none(stat, where + (name,))


def check_header(header, field=()):
    """Raise ``ValueError`` unless ``header`` is a cockpit-lite log header this reader understands."""
    _expect(header.get("format") == FORMAT, field + ("format",), f"{FORMAT!r} (not a {FORMAT} log)",
            header.get("format"))
    version = header.get("version", 1)
    _expect(_is_integer(version), field + ("version",), "an integer", version)
    if version > FORMAT_VERSION:
        raise _FieldError(field + ("version",), f"log format version {version} is newer than this reader "
                                                f"({FORMAT_VERSION}); update cockpit-lite")
    if "run" in header:
        _expect(isinstance(header["run"], str), field + ("run",), "a string (the run id)", header["run"])
    if header.get("resumed_after") is not None:
        _expect(_is_integer(header["resumed_after"]), field + ("resumed_after",), "an integer (a step)",
                header["resumed_after"])
    params = header.get("params")
    if params is not None:
        _expect(isinstance(params, list), field + ("params",), "a list of {'name', 'shape'}", params)
        for param in params:
            _expect(isinstance(param, dict) and isinstance(param.get("name"), str), field + ("params",),
                    "{'name': str, 'shape': [int, ...]}", param)
            shape = param.get("shape")
            _expect(shape is None or (isinstance(shape, list) and all(_is_integer(n) and n >= 0 for n in shape)),
                    field + ("params", "shape"), "a list of non-negative integers", shape)
    quantities = header.get("quantities")
    if quantities is not None:
        _expect(isinstance(quantities, list) and all(isinstance(q, str) for q in quantities),
                field + ("quantities",), "a list of quantity names", quantities)


def _parse(text, where, limits):
    """``json.loads`` that reports too deep nesting as a ``RecordError``, not a ``RecursionError``."""
    try:
        obj = json.loads(text)
    except RecursionError as error:
        raise RecordError(f"{where}: values nested too deeply for the JSON parser (thousands of levels; a record "
                          f"nests a few, the limit max_depth is {limits['max_depth']}): not a record") from error
    return obj


# ----------------------------------------------------------------------------- writing


def new_run_id():
    """A fresh run id: UTC time of day and 6 random hex digits, e.g. ``"20250301T101500-3fa2c1"``."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()


def _check_appendable(path):
    """Whether ``path`` can take a new segment; returns True if it lacks a final newline (torn)."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return False
    if size == 0:
        return False
    with open(path, "rb") as file:
        first = file.readline(4096)
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
    signature, start = b'{"format": "' + FORMAT.encode() + b'"', first.strip()
    torn_header = not first.endswith(b"\n") and signature.startswith(start)  # a run that died writing it
    if not (start.startswith(signature) or torn_header):
        raise ValueError(
            f"{path} exists and is not a {FORMAT} log (its first line is no {FORMAT} header); refusing to "
            "write into it. Fix: pass another log path, or move that file away."
        )
    return last != b"\n"


class JSONLinesWriter:
    """Append one JSON line per step part to ``path``, written at once; never truncates.

    Args:
        path: file to write; its folder is created if needed. An existing log is kept:
            the writer appends a new run segment (see the module docstring). A file
            that is not a cockpit-lite log is refused (``ValueError``).
        header: dict merged into ``{"format", "version", "run", "started"}``.
        strict: raise ``OSError`` when a write fails. By default a failing write
            (a full disk) warns once, keeps the line in memory and is retried, in
            order, at the next ``append`` and at ``close``; nothing raises.
        run: the run id of the segment to continue (a resumed run; default: a new
            id, ``new_run_id()``). Readers treat consecutive segments with the same id
            as one.

    The header line is written together with the first step's line (or at ``close``),
    so that ``resume`` can still name the run it continues.

    Attributes:
        run: the run id written in the header.
        pending: number of lines (or line parts) not yet on disk.
        errors: the ``OSError`` of every failed write, in order.
    """

    def __init__(self, path, header, strict=False, run=None):
        self.path = os.fspath(path)
        self.strict = strict
        self.run = run if run is not None else new_run_id()
        self.errors = []
        self.closed = False
        self._queue, self._done, self._failing = collections.deque(), 0, False
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        torn = _check_appendable(self.path)
        self._file = open(self.path, "ab", buffering=0)  # unbuffered: a write is on disk or not at all
        self._torn = torn  # a crashed run left half a line: end it, so that the new header stands on its own line
        first = {"format": FORMAT, "version": FORMAT_VERSION, "run": self.run,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if run is not None:
            first["resumed"] = True
        self._header = {**first, **{k: v for k, v in header.items() if k not in first}}  # written with the first line

    def resume(self, run, after):
        """Continue the segment of run ``run`` instead of starting one (a resumed run).

        ``after``: the last step the saved run had entered when its state was saved; readers
        drop what that segment holds at later steps (the saved run may have gone on past its
        checkpoint; the resumed run records those steps again).

        Raises:
            ValueError: once a step's line was written (the header is written with it).
        """
        if self._header is None:
            raise ValueError(f"the log {self.path} has its header already: resume a run before its first step")
        self.run = run
        self._header.update(run=run, resumed=True, resumed_after=after)

    @property
    def pending(self):
        return len(self._queue)

    def append(self, step, entries):
        """Append the ``entries`` of ``step`` as one line (and any line a failed write left)."""
        if self.closed:
            raise ValueError(f"the log {self.path} is closed; a closed Cockpit records no more steps")
        self._put({"step": int(step), **to_jsonable(entries)})

    def _put(self, obj):
        self._queue.append(self._take_header() + (json.dumps(obj) + "\n").encode("utf-8"))
        self._flush()

    def _take_header(self):
        """The header line (after a newline ending a torn line) if not written yet, else ``b""``."""
        if self._header is None:
            return b""
        header, self._header = self._header, None
        return (b"\n" if self._torn else b"") + (json.dumps(header) + "\n").encode("utf-8")

    def _flush(self):
        """Write the queue in order; returns whether it is empty. Partial writes continue where they stopped."""
        while self._queue:
            chunk = self._queue[0]
            try:
                written = self._file.write(memoryview(chunk)[self._done:])
                if not written:
                    raise OSError(errno.EIO, "the file took no bytes")
            except OSError as error:
                self._fail(error)
                return False
            self._done += written
            if self._done >= len(chunk):
                self._queue.popleft()
                self._done = 0
        self._failing = False
        return True

    def _fail(self, error):
        self.errors.append(error)
        if self.strict:
            raise OSError(error.errno, f"cannot write the log {self.path}: {error.strerror or error} "
                                       "(strict=True; the line is kept and written at the next step)") from error
        if not self._failing:
            warnings.warn(
                f"cockpit-lite: cannot write the log {self.path} ({error}); training goes on and the record "
                "stays complete in memory (get_output()). The unwritten lines are retried, in order, at every "
                "step and at close(); what close() cannot write stays in memory only (save it with "
                "cp.write(path) elsewhere). Fix: free space on that disk (strict=True raises instead).",
                RuntimeWarning, stacklevel=4,
            )
        self._failing = True

    def close(self):
        """Write what is pending, ``fsync`` and close the file. Later appends raise ``ValueError``.

        A failing write or ``fsync`` warns (once per failure streak) unless ``strict``.
        """
        if self.closed:
            return
        try:
            if self._header is not None:  # no step was recorded: the segment is its header
                self._queue.append(self._take_header())
            if self._flush():
                try:
                    os.fsync(self._file.fileno())
                except OSError as error:
                    if error.errno not in (errno.EINVAL, errno.ENOTSUP):  # a pipe or a special file
                        self._fail(error)
        finally:
            self.closed = True
            try:
                self._file.close()
            except OSError as error:  # pragma: no cover - unbuffered: nothing left to write
                self.errors.append(error)


# ----------------------------------------------------------------------------- reading


def _raw_lines(file, limit):
    """``(number, bytes or None)`` per line; ``None`` for a line longer than ``limit`` (skipped unread)."""
    number = 0
    while True:
        line = file.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit and not line.endswith(b"\n"):
            while True:  # skip the rest of the overlong line without holding it
                rest = file.readline(1 << 20)
                if not rest or rest.endswith(b"\n"):
                    break
            yield number, None
        else:
            yield number, line


class _Segment:
    def __init__(self, header, line):
        self.header, self.record, self.first_line, self.torn = header, {}, line, []


def _read_segments(path, limits):
    """Every segment of a JSON-lines log, validated (see ``read_jsonl``)."""
    path = os.fspath(path)
    segments, current, torn = [], None, None
    with open(path, "rb") as file:
        for number, raw in _raw_lines(file, limits["max_line_bytes"]):
            if raw is None:
                raise RecordError(f"{_where(path, number)}: line longer than " + _too_big("max_line_bytes", limits))
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
                obj = _parse(text, _where(path, number), limits)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                if torn is not None:
                    raise torn[1]
                torn = (number, RecordError(f"{_where(path, number)}: not valid JSON ({error})"))
                continue
            except ValueError as error:  # e.g. an integer with more than 4300 digits
                raise RecordError(f"{_where(path, number)}: not valid JSON ({error})") from error
            is_header = isinstance(obj, dict) and "format" in obj and "step" not in obj
            if torn is not None:
                if not is_header:
                    raise torn[1]  # a broken line in the middle of a segment
                if current is not None:
                    current.torn.append(torn[0])
                else:
                    warnings.warn(f"{path}: line {torn[0]} is incomplete (a run stopped while writing its header); "
                                  "it was skipped.", stacklevel=4)
                torn = None
            if not isinstance(obj, dict):
                raise RecordError(f"{_where(path, number)}: expected a JSON object (a header or a step), got "
                                  f"{json.dumps(obj)[:60]}")
            try:
                if is_header:
                    obj = _decode(obj, limits, ())
                    check_header(obj)
                    resumed = _resumed_segment(segments, current, obj)
                    if resumed is not None:  # a resumed run continues its segment
                        after = obj.get("resumed_after")
                        for later in [s for s in resumed.record if after is not None and s > after]:
                            del resumed.record[later]  # the saved run went on past its checkpoint: redone
                        resumed.header = {**resumed.header, **obj}
                        current = resumed
                    else:
                        current = _Segment(obj, number)
                        segments.append(current)
                    continue
                if current is None:
                    raise _FieldError(("format",), f"the log must start with a {FORMAT} header line "
                                                   f'{{"format": "{FORMAT}", ...}}; this file is no {FORMAT} log')
                if "step" not in obj:
                    raise _FieldError(("step",), 'missing: every line after the header is {"step": s, ...}')
                step = obj.pop("step")
                _expect(_is_integer(step), ("step",), "an integer", step)
                entry = _decode(obj, limits, ())
                check_entry(entry)
            except _FieldError as error:
                raise RecordError(f"{_where(path, number, field=error.field)}: {error.message}") from None
            merge(current.record, step, entry)
    if torn is not None:
        if current is None:
            raise torn[1]
        current.torn.append(torn[0])
    return segments


def _resumed_segment(segments, current, header):
    """The segment ``header`` continues: the current one with its run id, or (a header marked
    ``"resumed"``) the latest earlier one with it; ``None`` for a new segment."""
    run = header.get("run")
    if run is None:
        return None
    if current is not None and current.header.get("run") == run:
        return current
    if header.get("resumed"):
        return next((s for s in reversed(segments) if s.header.get("run") == run), None)
    return None


def _pick(segments, segment, path):
    if segment == "all":
        return segments
    if isinstance(segment, str):
        picked = [s for s in segments if s.header.get("run") == segment]
        if not picked:
            runs = [s.header.get("run") for s in segments]
            raise ValueError(f"{path}: no run segment with run id {segment!r} (the runs: {runs})")
        return picked[-1:]
    if not _is_integer(segment):
        raise ValueError(f"segment must be an index, a run id or 'all', not {segment!r}")
    if not segments:
        if segment in (0, -1):
            return [_Segment({}, 0)]
        raise ValueError(f"{path}: the log is empty; segment={segment} does not exist")
    if not -len(segments) <= segment < len(segments):
        raise ValueError(f"{path} holds {len(segments)} run segment(s): segment={segment} does not exist "
                         f"(use 0..{len(segments) - 1}, -1 for the last or 'all')")
    return [segments[segment]]


def _warn_torn(path, picked):
    for seg in picked:
        for number in seg.torn:
            warnings.warn(
                f"{path}: last line ({number}) of a run segment is incomplete (the run probably stopped "
                "while writing it); it was skipped.",
                stacklevel=3,
            )


def segments(path, limits=None):
    """The headers of the run segments of a JSON-lines log, oldest first (each with ``"steps"``: their count)."""
    found = _read_segments(path, _limits(limits))
    return [{**s.header, "steps": len(s.record)} for s in found]


def read_segment(path, segment=-1, limits=None):
    """``(header, record, count)``: one run segment of a JSON-lines log and how many it holds.

    ``segment`` and ``limits`` as for ``read_jsonl`` (``"all"`` is not accepted here).
    """
    if segment == "all":
        raise ValueError("read_segment reads one segment; use read_jsonl(path, segment='all') for all")
    limits = _limits(limits)
    path = os.fspath(path)
    found = _read_segments(path, limits)
    picked = _pick(found, segment, path)
    _warn_torn(path, picked)
    return picked[0].header, picked[0].record, len(found)


def read_jsonl(path, segment=-1, limits=None):
    """Read a JSON-lines log into ``(header, record)``.

    Args:
        path: the log.
        segment: which run segment (see the module docstring): ``-1`` the last (the
            default), any list index, a run id, or ``"all"``: then a list of
            ``(header, record)``, oldest first.
        limits: bounds overriding ``LIMITS`` for this call, e.g.
            ``{"max_line_bytes": 2**30}``.

    A segment's last line that does not parse (a run that crashed while writing
    it) is skipped with one warning; every other line is validated.

    Raises:
        RecordError: (a ``ValueError``) for a line that is not a record or that is
            beyond ``limits``, naming the file, the line and the field.
        ValueError: for a segment that does not exist.
    """
    if segment != "all":
        header, record, _ = read_segment(path, segment, limits)
        return header, record
    path = os.fspath(path)
    picked = _read_segments(path, _limits(limits))
    _warn_torn(path, picked)
    return [(s.header, s.record) for s in picked]


def write_json(path, record):
    """Write ``record`` as one JSON file in Cockpit's output layout."""
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    data = {str(step): to_jsonable(entry, tagged_arrays=True) for step, entry in sorted(record.items())}
    with open(path, "w", encoding="utf-8") as file:
        json.dump(data, file, indent=1)


def read_json(path, limits=None):
    """Read a JSON file written by ``write_json`` (or by Cockpit) into a record.

    Validated as ``read_jsonl`` validates a line (each step's entry within ``limits``);
    a bad file raises one ``RecordError`` naming the file, the step and the field.
    """
    limits = _limits(limits)
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size > limits["max_file_bytes"]:
        raise RecordError(f"{path}: a .json file of {size:,} bytes, more than " + _too_big("max_file_bytes", limits))
    with open(path, "rb") as file:
        raw = file.read()
    try:
        data = _parse(raw.decode("utf-8"), path, limits)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        line = f", line {error.lineno}" if hasattr(error, "lineno") else ""
        raise RecordError(f"{path}{line}: not valid JSON ({error})") from error
    except ValueError as error:
        raise RecordError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(data, dict):
        raise RecordError(f"{path}: expected a record {{step: {{quantity: value}}}} (a JSON object), got "
                          f"{json.dumps(data)[:60]}")
    record = {}
    for key, entry in data.items():
        try:
            step = int(key)
        except ValueError:
            raise RecordError(f"{path}: key {key[:40]!r} is not a step (an integer)") from None
        try:
            _expect(isinstance(entry, dict), (), "a step record (a JSON object)", entry)
            decoded = _decode(entry, limits, ())
            check_entry(decoded)
        except _FieldError as error:
            raise RecordError(f"{_where(path, step=key, field=error.field)}: {error.message}") from None
        record[step] = decoded
    return record


def read(source, segment=-1, limits=None):
    """Return the record held by ``source``: a record dict, a ``.jsonl`` or a ``.json`` path.

    Args:
        source: what to read.
        segment: for a ``.jsonl`` log, which run segment (``-1``: the last; an index, a
            run id, or ``"all"`` for a list of records, oldest first). A ``.json`` file
            holds one.
        limits: bounds overriding ``LIMITS`` (see ``read_jsonl``).
    """
    if isinstance(source, dict):
        return source
    path = os.fspath(source)
    if path.endswith(".jsonl"):
        out = read_jsonl(path, segment, limits)
        return [record for _, record in out] if segment == "all" else out[1]
    record = read_json(path, limits)
    if segment == "all":
        return [record]
    if segment not in (0, -1):
        raise ValueError(f"{path}: a .json file holds one run; segment={segment!r} does not exist")
    return record


def is_finite_number(value):
    """Whether ``value`` is a real, finite number (not None, NaN or Inf)."""
    return isinstance(value, (int, float, np.number)) and math.isfinite(float(value))
