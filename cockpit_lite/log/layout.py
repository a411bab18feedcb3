"""Cockpit's JSON layout: the whole record as one ``{step: {quantity: value}}`` file, arrays as
json_tricks writes them (``write_json``, ``read_json``)."""

import json
import os

from cockpit_lite.log.limits import (
    FieldError, RecordError, check_entry, decode_value, expect, located, parse_json, resolve_limits, too_big,
)
from cockpit_lite.log.record import to_jsonable


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
    limits = resolve_limits(limits)
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size > limits["max_file_bytes"]:
        raise RecordError(f"{path}: a .json file of {size:,} bytes, more than " + too_big("max_file_bytes", limits))
    with open(path, "rb") as file:
        raw = file.read()
    try:
        data = parse_json(raw.decode("utf-8"), path, limits)
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
            expect(isinstance(entry, dict), (), "a step record (a JSON object)", entry)
            decoded = decode_value(entry, limits, ())
            check_entry(decoded)
        except FieldError as error:
            raise RecordError(f"{located(path, step=key, field=error.field)}: {error.message}") from None
        record[step] = decoded
    return record
