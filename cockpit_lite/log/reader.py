"""``read``: the record held by a record dict, a ``.jsonl`` log or a ``.json`` file."""

import os

from cockpit_lite.log.layout import read_json
from cockpit_lite.log.segments import read_jsonl


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
