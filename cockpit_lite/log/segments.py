"""Reading a JSON-lines log: its run segments (a resumed run continues one), each validated as it is
read; a torn last line warned about (``read_jsonl``, ``segments``, ``read_segment``)."""

import json
import os
import warnings

from cockpit_lite.log.limits import (
    FieldError, RecordError, _is_integer, check_entry, check_header, decode_value, expect, located, parse_json,
    resolve_limits, too_big,
)
from cockpit_lite.log.record import FORMAT, merge


def _raw_lines(file, limit):
    """``(number, bytes or None)`` per line; ``None`` for a line longer than ``limit`` (read no further than
    ``limit`` bytes: the reader refuses the log there)."""
    number = 0
    while True:
        line = file.readline(limit + 1)
        if not line:
            return
        number += 1
        yield number, (None if len(line) > limit and not line.endswith(b"\n") else line)


class _Segment:
    def __init__(self, header):
        self.header, self.record, self.torn = header, {}, []


def _read_segments(path, limits):
    """Every segment of a JSON-lines log, validated (see ``read_jsonl``)."""
    path = os.fspath(path)
    segments, current, torn = [], None, None
    with open(path, "rb") as file:
        for number, raw in _raw_lines(file, limits["max_line_bytes"]):
            if raw is None:
                raise RecordError(f"{located(path, number)}: line longer than " + too_big("max_line_bytes", limits))
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
                obj = parse_json(text, located(path, number), limits)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                if torn is not None:
                    raise torn[1]
                torn = (number, RecordError(f"{located(path, number)}: not valid JSON ({error})"))
                continue
            except ValueError as error:  # e.g. an integer with more than 4300 digits
                raise RecordError(f"{located(path, number)}: not valid JSON ({error})") from error
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
                raise RecordError(f"{located(path, number)}: expected a JSON object (a header or a step), got "
                                  f"{json.dumps(obj)[:60]}")
            try:
                if is_header:
                    obj = decode_value(obj, limits, ())
                    check_header(obj)
                    resumed = _resumed_segment(segments, current, obj)
                    if resumed is not None:  # a resumed run continues its segment
                        after = obj.get("resumed_after")
                        for later in [s for s in resumed.record if after is not None and s > after]:
                            del resumed.record[later]  # the saved run went on past its checkpoint: redone
                        resumed.header = {**resumed.header, **obj}
                        current = resumed
                    else:
                        current = _Segment(obj)
                        segments.append(current)
                    continue
                if current is None:
                    raise FieldError(("format",), f"the log must start with a {FORMAT} header line "
                                                   f'{{"format": "{FORMAT}", ...}}; this file is no {FORMAT} log')
                if "step" not in obj:
                    raise FieldError(("step",), 'missing: every line after the header is {"step": s, ...}')
                step = obj.pop("step")
                expect(_is_integer(step), ("step",), "an integer", step)
                entry = decode_value(obj, limits, ())
                check_entry(entry)
            except FieldError as error:
                raise RecordError(f"{located(path, number, field=error.field)}: {error.message}") from None
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
            return [_Segment({})]
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
    found = _read_segments(path, resolve_limits(limits))
    return [{**s.header, "steps": len(s.record)} for s in found]


def read_segment(path, segment=-1, limits=None):
    """``(header, record, count)``: one run segment of a JSON-lines log and how many it holds.

    ``segment`` and ``limits`` as for ``read_jsonl`` (``"all"`` is not accepted here).
    """
    if segment == "all":
        raise ValueError("read_segment reads one segment; use read_jsonl(path, segment='all') for all")
    limits = resolve_limits(limits)
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
    picked = _read_segments(path, resolve_limits(limits))
    _warn_torn(path, picked)
    return [(s.header, s.record) for s in picked]
