"""The record: the only thing that crosses from collection to rendering (the format:
``cockpit_lite.log.record``). It imports neither torch nor any other part of ``cockpit_lite``,
so the ``instruments`` package can depend on it alone.

Rooms: ``record`` (the format, its keys, JSON conversion), ``limits`` (bounds and validation of
what a reader accepts), ``writer`` (the JSON-lines log), ``segments`` (reading its run
segments), ``layout`` (Cockpit's one-file JSON layout), ``reader`` (``read`` of any of them).
"""

from cockpit_lite.log.layout import read_json, write_json
from cockpit_lite.log.limits import (
    HISTOGRAM_KEYS, LIMITS, PER_PARAMETER_KEYS, SCALAR_KEYS, RecordError, check_entry, check_header, from_jsonable,
)
from cockpit_lite.log.reader import read
from cockpit_lite.log.record import (
    BATCH, BUDGET, EPOCH_KEYS, FINDINGS, FLAGS, FORMAT, FORMAT_VERSION, LAYERS, META, RESERVED_KEYS,
    is_finite_number, layer_values, merge, to_jsonable,
)
from cockpit_lite.log.segments import read_jsonl, read_segment, segments
from cockpit_lite.log.writer import JSONLinesWriter, new_run_id

__all__ = [
    "BATCH", "BUDGET", "EPOCH_KEYS", "FINDINGS", "FLAGS", "FORMAT", "FORMAT_VERSION", "HISTOGRAM_KEYS", "LAYERS",
    "LIMITS", "META", "PER_PARAMETER_KEYS", "RESERVED_KEYS", "SCALAR_KEYS", "JSONLinesWriter", "RecordError",
    "check_entry", "check_header", "from_jsonable", "is_finite_number", "layer_values", "merge", "new_run_id", "read",
    "read_json", "read_jsonl", "read_segment", "segments", "to_jsonable", "write_json",
]
