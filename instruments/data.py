"""Read values out of a record, and turn any source into a record.

A record is ``{step: {key: value}}`` (see ``cockpit_lite.log``). Every quantity is
tracked on its own schedule, so each key appears at a subset of the steps; the
helpers here return only the steps where a key is present, sorted.

Sources (``load``) may be

- a record dict (steps may be ``int`` or ``str``);
- a path to a ``.jsonl`` log (its header names the parameters) or a ``.json`` file
  written by ``Cockpit.write`` (a path without extension is tried with ``.jsonl``
  then ``.json``, as Cockpit's plotter takes the log path without ``.json``). A log
  that several runs appended to holds one *run segment* each: ``load`` reads the last
  one unless ``segment=`` names another (an index or a run id; see
  ``cockpit_lite.log``). Files are validated as they are read (``cockpit_lite.log``:
  a file that is not a record raises ``ValueError`` naming the file, the line and the
  field; sizes are bounded by ``limits``);
- a live cockpit: any object with ``get_output()`` returning the record; when it
  also has ``param_names`` or ``names`` (list of str, as ``cockpit_lite.Cockpit``)
  or ``header["params"]``, those label the layers;
- a ``Run`` (returned as is).

Also here, for every place in ``instruments`` that writes a picture or draws text
from a file: ``atomic_save`` (write to a temporary file in the same folder, then
rename: a killed process never leaves a half-written picture under the final name)
and ``literal_text`` (no mathtext: a ``$`` in a finding or a name is a dollar sign).
"""

import contextlib
import math
import os
import threading
import uuid
from dataclasses import dataclass, field

import numpy as np

from cockpit_lite import log

#: How per-parameter lists combine into the total of the network.
TOTALS = {
    "GradNorm": "rss",
    "Distance": "rss",
    "UpdateSize": "rss",
    "HessTrace": "sum",
    "GradVariance": "sum",
}

#: The smallest configuration level that tracks each key (for "not tracked" hints).
LEVELS = {
    "Loss": "economy",
    "Alpha": "economy",
    "Distance": "economy",
    "UpdateSize": "economy",
    "GradNorm": "economy",
    "GradHist1d": "economy",
    "NormTest": "economy",
    "InnerTest": "economy",
    "OrthoTest": "economy",
    "MeanGSNR": "economy",
    "GradVariance": "economy",
    "TICDiag": "business",
    "TICTrace": "business",
    "HessTrace": "business",
    "HessMaxEV": "full",
    "GradHist2d": "full",
}


@dataclass
class Run:
    """A record plus what is known about it: layer names, a display name, the log header."""

    record: dict
    params: list = None
    name: str = "run"
    header: dict = field(default_factory=dict)
    path: str = None
    segments: int = 1  # how many run segments the log it came from holds (``load`` picked one)

    def layer_names(self, n):
        """Names for ``n`` layers: the known parameter names, else ``param_i``."""
        names = list(self.params or [])
        if len(names) < n:
            names += [f"param_{i}" for i in range(len(names), n)]
        return names[:n]


def _param_names(params):
    if not params:
        return None
    return [p["name"] if isinstance(p, dict) else str(p) for p in params]


def _normalise(record):
    if all(isinstance(k, int) for k in record):
        return record
    return {int(k): v for k, v in record.items()}


def resolve_path(path):
    """Return an existing log file for ``path`` (trying ``.jsonl`` and ``.json``).

    Only files count: Cockpit's scripts save their figures into a folder named like
    the log (``savedir=logpath``), so ``logpath`` may be a folder next to ``logpath.json``.
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    for ext in (".jsonl", ".json"):
        if os.path.isfile(path + ext):
            return path + ext
    raise FileNotFoundError(f"no log at {path!r} (no such file, also tried .jsonl and .json)")


def load(source, name=None, discard=None, segment=-1, limits=None):
    """Turn ``source`` into a ``Run`` (see the module docstring for accepted sources).

    Args:
        source: record dict, log path, live cockpit or ``Run``.
        name: display name; defaults to the log's file name (without extension)
            or ``"cockpit"``.
        discard: if given, drop all steps after this one (as Cockpit's plotter).
        segment: for a ``.jsonl`` log, the run segment to read (``-1``: the last;
            an index or a run id).
        limits: reader bounds for a file source (``cockpit_lite.log.LIMITS``).

    Raises:
        FileNotFoundError: for a path with no log.
        ValueError: for a file that is not a record (naming the file, the line and
            the field), one beyond ``limits``, or a segment it does not hold.
    """
    if isinstance(source, Run):
        run = source
    elif isinstance(source, dict):
        run = Run(record=_normalise(source), name=name or "cockpit")
    elif hasattr(source, "get_output"):
        params = getattr(source, "param_names", None)
        if params is None:  # cockpit_lite.Cockpit keeps them as ``names``
            names = getattr(source, "names", None)
            if isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names):
                params = names
        header = getattr(source, "header", None)
        if params is None and isinstance(header, dict):
            params = header.get("params")
        run = Run(record=_normalise(source.get_output()), params=_param_names(params), name=name or "cockpit")
    elif isinstance(source, (str, os.PathLike)):
        path = resolve_path(source)
        stem = os.path.splitext(os.path.basename(path))[0]
        if path.endswith(".jsonl"):
            header, record, count = log.read_segment(path, segment, limits)
            run = Run(record, _param_names(header.get("params")), name or stem, header, path, count)
        else:
            if segment not in (0, -1):
                raise ValueError(f"{path}: a .json file holds one run; segment={segment!r} does not exist")
            run = Run(log.read_json(path, limits), None, name or stem, {}, path)
    else:
        raise TypeError(
            "source must be a record dict, a path to a .jsonl/.json log, or an object "
            f"with get_output(); got {type(source).__name__}"
        )
    if name is not None:
        run.name = name
    if discard is not None:
        run = Run({s: e for s, e in run.record.items() if s <= discard}, run.params, run.name, run.header, run.path,
                  run.segments)
    return run


def atomic_save(save, path):
    """Write a file so that ``path`` only ever holds a complete one: ``save(temporary)``, then rename.

    The temporary file lies in the same folder (so the rename is atomic, ``os.replace``)
    and keeps the extension (so ``savefig`` infers the same format); it is removed if
    ``save`` fails. A process killed while saving leaves at most a hidden
    ``.<name>.*.tmp.<ext>`` file, never a truncated picture under the final name.

    Args:
        save: called with the temporary path; writes the file.
        path: the final path (its folder is created).

    Returns:
        ``path``.
    """
    path = os.fspath(path)
    folder, base = os.path.split(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    stem, ext = os.path.splitext(base)
    temporary = os.path.join(folder, f".{stem}.{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}.tmp{ext}")
    try:
        save(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


@contextlib.contextmanager
def literal_text():
    """Within this block matplotlib draws text as given (``text.parse_math`` off).

    Text from a file (finding messages, parameter and run names) may hold ``$``: as
    mathtext, ``$x^{$`` would fail to parse and stop the whole figure. Text objects
    keep the setting they were created with, so drawing (not saving) must happen
    inside the block. The setting is process-wide while the block runs.
    """
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):
        yield


def snapshot(record, previous=None, settled=2):
    """Copy a record cheaply so that a training loop may keep appending to the original.

    Step dicts, their ``layers`` dicts and ``flags`` lists are copied; values themselves
    (floats, lists, arrays) are shared, as a cockpit never mutates a stored value.

    Args:
        record: the live record.
        previous: an earlier snapshot of the same record. Its copies of steps more than
            ``settled`` steps before its last step are reused instead of copied again
            (a cockpit only adds to the newest steps: two-step quantities such as
            ``Alpha`` arrive one step late), which makes repeated snapshots of a long
            run cost O(new steps) dict copies instead of O(all steps).
        settled: how many of the newest steps of ``previous`` may still change.
    """
    if previous:
        cutoff = max(previous) - settled
        out = dict(previous)
        fresh = (record.keys() - previous.keys()) | {s for s in previous if s >= cutoff}
        for gone in previous.keys() - record.keys():
            del out[gone]
    else:
        out, fresh = {}, list(record.keys())
    for step in fresh:
        entry = record.get(step)
        if entry is None:
            continue
        copy = dict(entry)
        if log.LAYERS in copy:
            copy[log.LAYERS] = dict(copy[log.LAYERS])
        if log.FLAGS in copy:
            copy[log.FLAGS] = list(copy[log.FLAGS])
        out[step] = copy
    return out


#: Keys no gauge draws (``Parameters`` holds every parameter value: large).
UNDRAWN = ("Parameters",)
#: Keys of which the gauges draw only the last occurrence by default.
LAST_ONLY = ("GradHist1d", "GradHist2d")


def drawable(record):
    """A copy of ``record`` without what the default dashboard does not draw.

    Drops ``UNDRAWN`` keys and every ``LAST_ONLY`` histogram (also per layer) but the
    last one, so that shipping a long run to a render process costs kilobytes, not
    the megabytes of histograms it accumulated. Unchanged entries are shared.
    """
    last = {key: max((s for s, e in record.items() if key in e), default=None) for key in LAST_ONLY}
    last_layer = {key: max((s for s, e in record.items() if key in e.get(log.LAYERS, {})), default=None)
                  for key in LAST_ONLY}
    out = {}
    for step, entry in record.items():
        drop = [k for k in UNDRAWN if k in entry] + [k for k in LAST_ONLY if k in entry and step != last[k]]
        layers = entry.get(log.LAYERS, {})
        drop_layers = [k for k in LAST_ONLY if k in layers and step != last_layer[k]]
        if not drop and not drop_layers:
            out[step] = entry
            continue
        copy = {k: v for k, v in entry.items() if k not in drop}
        if drop_layers:
            copy[log.LAYERS] = {k: v for k, v in layers.items() if k not in drop_layers}
        out[step] = copy
    return out


# ----------------------------------------------------------------------------- values


def to_float(value):
    """A scalar record value as float (``nan`` for None or anything non-numeric)."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def total(key, value):
    """The network total of a value: per-parameter lists combine as ``TOTALS[key]``."""
    if isinstance(value, (list, tuple, np.ndarray)):
        arr = np.asarray(value, dtype=float).ravel()
        if arr.size == 0:
            return math.nan
        if TOTALS.get(key, "sum") == "rss":
            return float(np.sqrt(np.sum(arr**2)))
        return float(np.sum(arr))
    return to_float(value)


def tracked(record, *keys):
    """Which of ``keys`` occur at least once in ``record``."""
    found = set()
    for entry in record.values():
        found.update(k for k in keys if k in entry)
        if len(found) == len(keys):
            break
    return [k for k in keys if k in found]


def steps(record, key):
    """Sorted steps at which ``key`` is present."""
    return sorted(s for s, e in record.items() if key in e)


def series(record, key):
    """``(steps, values)`` float arrays of the total of ``key`` (NaNs kept)."""
    xs = steps(record, key)
    return np.asarray(xs, dtype=float), np.asarray([total(key, record[s][key]) for s in xs], dtype=float)


def finite(xs, ys):
    """Drop the points whose value is not finite."""
    mask = np.isfinite(ys)
    return xs[mask], ys[mask]


def layer_series(record, key):
    """``(steps, matrix)``: per-layer values of ``key``, one row per step, NaN-padded.

    Per-parameter lists (``GradNorm`` ...) and ``entry["layers"][key]`` are both used
    (``cockpit_lite.log.layer_values``). Returns empty arrays when there are none.
    """
    xs, rows = [], []
    for step in sorted(record):
        values = log.layer_values(record[step], key)
        if values is None:
            continue
        if values and not isinstance(values[0], (int, float, np.number, type(None))):
            return np.array([]), np.empty((0, 0))  # e.g. per-layer histograms
        xs.append(step)
        rows.append([to_float(v) for v in values])
    if not rows:
        return np.array([]), np.empty((0, 0))
    width = max(len(r) for r in rows)
    matrix = np.full((len(rows), width), np.nan)
    for i, row in enumerate(rows):
        matrix[i, : len(row)] = row
    return np.asarray(xs, dtype=float), matrix


def n_layers(record):
    """Number of parameter tensors, from the longest per-layer list in the record."""
    n = 0
    for step in sorted(record)[-20:]:
        entry = record[step]
        for key in TOTALS:
            if isinstance(entry.get(key), (list, tuple)):
                n = max(n, len(entry[key]))
        for values in entry.get(log.LAYERS, {}).values():
            if isinstance(values, (list, tuple)):
                n = max(n, len(values))
    return n


def last_value(record, key, which="finite"):
    """``(step, total)`` of the last occurrence of ``key`` (the last finite one by default)."""
    xs, ys = series(record, key)
    if which == "finite":
        xs, ys = finite(xs, ys)
    if len(xs) == 0:
        return None, math.nan
    return int(xs[-1]), float(ys[-1])


def histogram(record, key, step=None, layer=None):
    """``(step, hist_dict)`` of histogram ``key`` at ``step`` (default: last tracked).

    With ``layer`` set, the per-layer histogram ``entry["layers"][key][layer]``.
    Returns ``(None, None)`` when there is none.
    """
    candidates = sorted(record) if step is None else [step]
    for s in reversed(candidates):
        entry = record.get(s, {})
        if layer is None:
            value = entry.get(key)
        else:
            per_layer = entry.get(log.LAYERS, {}).get(key)
            value = per_layer[layer] if per_layer is not None and layer < len(per_layer) else None
        if isinstance(value, dict) and "hist" in value:
            return s, value
    return None, None


def flagged_steps(record, flag=None):
    """Steps carrying any flag (or the given one), with their flags."""
    out = {}
    for step in sorted(record):
        flags = record[step].get(log.FLAGS) or []
        flags = [f for f in flags if flag is None or f == flag]
        if flags:
            out[step] = flags
    return out


def smooth(values, window=None):
    """Smoothed copy of ``values`` for display: a centred moving average.

    The window (``clip(n // 15, 3, 201)`` points for ``n`` finite values by default)
    shrinks symmetrically towards both ends, so the curve never lags behind the data
    (the last point is the raw last value; ``recent`` gives a robust "current value"),
    and a value only affects its neighbours, so an explosion at the end of a run
    cannot bend the whole curve. Positive values spanning more than a
    factor of 30 are averaged in log space (a geometric mean), as they are drawn
    on a log axis. NaN/Inf positions stay NaN and are skipped.
    """
    values = np.asarray(values, dtype=float)
    out = np.full(len(values), np.nan)
    finite = np.isfinite(values)
    x = values[finite]
    n = len(x)
    if n == 0:
        return out
    logged = x.min() > 0 and x.max() / x.min() > 30.0
    if logged:
        x = np.log(x)
    if window is None:
        window = int(np.clip(n // 15, 3, 201))
    half = max(int(window), 1) // 2
    cumulative = np.concatenate([[0.0], np.cumsum(x)])
    index = np.arange(n)
    reach = np.minimum(np.minimum(index, n - 1 - index), half)
    lo, hi = index - reach, index + reach + 1
    y = (cumulative[hi] - cumulative[lo]) / (hi - lo)
    out[finite] = np.exp(y) if logged else y
    return out


def recent(values, window=None):
    """A robust current value: the median of the last ``window`` finite values.

    ``window`` defaults to the smoothing window of ``smooth`` (at least 3 points).
    """
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan
    if window is None:
        window = int(np.clip(len(values) // 15, 3, 201))
    return float(np.median(values[-window:]))


def step_range(record):
    """``(first, last)`` step of the record, or ``(0, 0)`` for an empty one."""
    if not record:
        return 0, 0
    return min(record), max(record)


def wall_time(record):
    """Seconds between the first and last ``Time`` entry (``nan`` if fewer than two)."""
    xs, ys = finite(*series(record, "Time"))
    if len(ys) < 2:
        return math.nan
    return float(ys[-1] - ys[0])


TIER_NAMES = ("bookkeeping", "per-sample", "curvature")
"""The overhead budget's tiers, cheapest first (``cockpit_lite.budget.TIERS``)."""


def budget_bought(record):
    """What an overhead budget bought in ``record``: ``None`` without a budget, else ``{"factor",
    "average": the run's average step time over the plain step at its last plan (the budget's own
    account), "tiers": {tier: {"quantities": [names], "steps": how many steps recorded any of
    them, "last": the last such step}}}``, from the tiers of the last plan (``log.BUDGET``)."""
    plans = [record[step][log.BUDGET] for step in sorted(record) if log.BUDGET in record[step]]
    if not plans:
        return None
    last = plans[-1]
    tiers = {}
    for index, name in enumerate(TIER_NAMES):
        names = sorted(q for q, tier in last.get("tiers", {}).items() if tier == index)
        if names:
            steps = [step for step, entry in record.items() if any(q in entry for q in names)]
            tiers[name] = {"quantities": names, "steps": len(steps), "last": max(steps, default=None)}
    return {"factor": last.get("factor"), "average": last.get("average"), "tiers": tiers}
