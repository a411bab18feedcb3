"""Reading untrusted files: the bounds on what a reader accepts (``LIMITS``), the decoding of values
(json_tricks arrays included) and the validation of every entry and header (``RecordError``); see
``cockpit_lite.log.record``."""

import base64
import json
import math
import os
import zlib

import numpy as np

from cockpit_lite.log.record import BATCH, BUDGET, EPOCH_KEYS, FINDINGS, FLAGS, FORMAT, FORMAT_VERSION, LAYERS, META


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


class FieldError(ValueError):
    """A problem inside one value; the reader adds the file and the line."""

    def __init__(self, field, message):
        super().__init__(message)
        self.field = field
        self.message = message


def resolve_limits(limits):
    """``LIMITS`` updated by ``limits`` (a dict; unknown names are refused)."""
    out = dict(LIMITS)
    if limits:
        unknown = set(limits) - set(LIMITS)
        if unknown:
            raise ValueError(f"unknown reader limit(s) {sorted(unknown)}; known: {sorted(LIMITS)}")
        out.update(limits)
    return out


def too_big(name, limits):
    """The end of a message about a value beyond ``LIMITS[name]``: the limit and how to raise it."""
    return (f"the limit {name}={limits[name]:,}; for a file you trust, raise it: limits={{'{name}': N}} "
            f"(cockpit_lite.log.LIMITS['{name}'] = N, or python -m instruments --limit {name}=N)")


def _field_name(field):
    return ".".join(str(k) for k in field) if field else None


def located(path, line=None, step=None, field=None):
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
    limits = resolve_limits(limits)
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
                             + too_big("max_array_bytes", limits))
        prefix, _, payload = data.partition(":")
        if prefix not in ("b64", "b64.gz"):
            raise ValueError(f"unknown json_tricks array encoding {prefix[:20]!r} (expected b64 or b64.gz)")
        if len(payload) > 2 * limits["max_array_bytes"] + 1024:
            raise ValueError(f"encoded array of {len(payload):,} characters, more than twice "
                             + too_big("max_array_bytes", limits))
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
        raise ValueError(f"array of {array.nbytes:,} bytes, more than " + too_big("max_array_bytes", limits))
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
        raise FieldError(field, f"expected a regular array of numbers ({error})"[:300]) from error
    if array.dtype.kind not in "biuf" and not (array.dtype.kind == "O" and array.size == 0) or array.ndim == 0:
        raise FieldError(field, f"expected an array of numbers, got {str(value)[:60]!r}")
    return array


_CONTAINERS = (dict, list)


def decode_value(value, limits, field, depth=1, budget=None):
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
        raise FieldError(field, "values nested deeper than " + too_big("max_depth", limits))
    budget[0] -= len(value)
    if budget[0] < 0:
        raise FieldError(field, "more list and dict elements in one step than " + too_big("max_items", limits))
    if isinstance(value, list):
        if set(map(type, value)).isdisjoint(_CONTAINERS):  # numbers and strings: nothing to decode
            return value
        return [decode_value(v, limits, field, depth + 1, budget) for v in value]
    if "__ndarray__" in value:
        try:
            return _tagged_array(value, limits)
        except ValueError as error:
            raise FieldError(field, str(error)) from error
    out = {k: decode_value(v, limits, field + (k,) if len(field) < 3 else field, depth + 1, budget)
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
    limits = resolve_limits(limits)
    try:
        return decode_value(value, limits, ())
    except FieldError as error:
        raise ValueError(f"field {_field_name(error.field)!r}: {error.message}" if error.field else error.message)


# ----------------------------------------------------------------------------- validation


def _is_number(value):
    return isinstance(value, (int, float)) and (not isinstance(value, int) or abs(value) < 2**1023)


def _is_integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def expect(condition, field, expected, value):
    if not condition:
        shown = json.dumps(value, default=str)[:60] if not isinstance(value, np.ndarray) else "an array"
        raise FieldError(field, f"expected {expected}, got {shown}")


def _number_or_none(value, field):
    expect(value is None or _is_number(value), field, "a number or null", value)


def _check_finding(finding, field):
    expect(isinstance(finding, dict), field, "a finding (a dict)", finding)
    for key in ("kind", "severity", "message"):
        expect(isinstance(finding.get(key), str), field + (key,), "a string", finding.get(key))
    for key in ("layer", "suggestion"):
        expect(finding.get(key) is None or isinstance(finding[key], str), field + (key,), "a string or null",
                finding.get(key))
    expect(_is_integer(finding.get("step")), field + ("step",), "an integer", finding.get("step"))
    expect(finding.get("evidence") is None or isinstance(finding["evidence"], dict), field + ("evidence",),
            "a dict or null", finding.get("evidence"))


def check_entry(entry, field=()):
    """Raise ``ValueError`` unless ``entry`` (one decoded step of a record) has the record's layout.

    The reserved keys and the quantities drawn by ``instruments`` and read by the
    diagnosis are checked (``SCALAR_KEYS``, ``PER_PARAMETER_KEYS``, ``HISTOGRAM_KEYS``,
    ``ActivationStats``, ``InputStats``); other keys (custom quantities) may hold any
    JSON value. The error names the field.
    """
    expect(isinstance(entry, dict), field, "a step record (a JSON object)", entry)
    for key, value in entry.items():
        where = field + (key,)
        if key in SCALAR_KEYS:
            _number_or_none(value, where)
        elif key in EPOCH_KEYS:
            expect(value is None or _is_number(value) or (isinstance(value, list) and all(
                v is None or _is_number(v) for v in value)), where, "a number, null or a list of numbers", value)
        elif key in PER_PARAMETER_KEYS:
            expect(isinstance(value, (list, np.ndarray)), where, "a list of numbers (one per parameter)", value)
            if isinstance(value, list):
                for item in value:
                    _number_or_none(item, where)
        elif key in HISTOGRAM_KEYS:
            expect(isinstance(value, dict) and isinstance(value.get("hist"), np.ndarray), where,
                    "a histogram {'hist': [...], 'edges': [...]}", value)
        elif key == FLAGS:
            expect(isinstance(value, list) and all(isinstance(f, str) for f in value), where,
                    "a list of strings", value)
        elif key == FINDINGS:
            expect(isinstance(value, list), where, "a list of findings", value)
            for finding in value:
                _check_finding(finding, where)
        elif key == LAYERS:
            expect(isinstance(value, dict), where, "a dict {quantity: per-layer list}", value)
            for name, values in value.items():
                expect(isinstance(values, list), where + (name,), "a list (one value per parameter)", values)
                for item in values:
                    expect(item is None or _is_number(item) or isinstance(item, (dict, list)), where + (name,),
                            "numbers or histograms", item)
        elif key in (META, BUDGET):
            expect(isinstance(value, dict), where, "a dict", value)
        elif key == BATCH:
            expect(isinstance(value, dict), where, "a dict {'size': B, 'accumulated': bool, 'passes': k}", value)
            if "size" in value:
                _number_or_none(value["size"], where + ("size",))
        elif key == "ActivationStats":
            expect(isinstance(value, dict), where, "a dict {module: statistics}", value)
            for module, stats in value.items():
                expect(isinstance(stats, dict), where + (module,), "a dict of statistics", stats)
                for name, stat in stats.items():
                    expect(stat is None or _is_number(stat) or isinstance(stat, str), where + (module, name),
                            "a number, a string or null", stat)
        elif key == "InputStats":
            expect(isinstance(value, dict), where, "a dict of statistics", value)
            for name, stat in value.items():
                _number_or_none(stat, where + (name,))


def check_header(header, field=()):
    """Raise ``ValueError`` unless ``header`` is a cockpit-lite log header this reader understands."""
    expect(header.get("format") == FORMAT, field + ("format",), f"{FORMAT!r} (not a {FORMAT} log)",
            header.get("format"))
    version = header.get("version", 1)
    expect(_is_integer(version), field + ("version",), "an integer", version)
    if version > FORMAT_VERSION:
        raise FieldError(field + ("version",), f"log format version {version} is newer than this reader "
                                                f"({FORMAT_VERSION}); update cockpit-lite")
    if "run" in header:
        expect(isinstance(header["run"], str), field + ("run",), "a string (the run id)", header["run"])
    if header.get("resumed_after") is not None:
        expect(_is_integer(header["resumed_after"]), field + ("resumed_after",), "an integer (a step)",
                header["resumed_after"])
    params = header.get("params")
    if params is not None:
        expect(isinstance(params, list), field + ("params",), "a list of {'name', 'shape'}", params)
        for param in params:
            expect(isinstance(param, dict) and isinstance(param.get("name"), str), field + ("params",),
                    "{'name': str, 'shape': [int, ...]}", param)
            shape = param.get("shape")
            expect(shape is None or (isinstance(shape, list) and all(_is_integer(n) and n >= 0 for n in shape)),
                    field + ("params", "shape"), "a list of non-negative integers", shape)
    quantities = header.get("quantities")
    if quantities is not None:
        expect(isinstance(quantities, list) and all(isinstance(q, str) for q in quantities),
                field + ("quantities",), "a list of quantity names", quantities)


def parse_json(text, where, limits):
    """``json.loads`` that reports too deep nesting as a ``RecordError``, not a ``RecursionError``."""
    try:
        obj = json.loads(text)
    except RecursionError as error:
        raise RecordError(f"{where}: values nested too deeply for the JSON parser (thousands of levels; a record "
                          f"nests a few, the limit max_depth is {limits['max_depth']}): not a record") from error
    return obj
