"""The sink interface of ``Cockpit(..., sinks=[...])``.

A sink gets every part of a step that the Cockpit records, right after it is merged
into the record: ``write(step, entries, names)`` with ``entries`` a dict in the
record's layout (``cockpit_lite.log``: quantity names to host values — floats, lists
of per-parameter floats, histogram dicts — plus ``"layers"``, ``"flags"``,
``"batch"`` and the epoch keys of ``Cockpit.log``) and ``names`` the parameter names.
Two-step quantities (``Alpha``) arrive one step later, under their own step.
``close()`` is called by ``Cockpit.close``.
"""

import numbers

from cockpit_lite import log


class Sink:
    """Base class of sinks; ``write`` must be overridden."""

    def write(self, step, entries, names):
        """Receive the ``entries`` recorded at ``step``."""
        raise NotImplementedError

    def close(self):
        """End of the run (``Cockpit.close``)."""


def is_scalar(value):
    """A real number (bools excluded)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_histogram(value):
    """A 1-d or 2-d histogram value ``{"hist": ..., "edges": ...}``."""
    return isinstance(value, dict) and "hist" in value and "edges" in value


def scalars(entries, names):
    """The scalar values of ``entries`` as ``(tag, value)`` pairs.

    Scalars keep their key (``"NormTest"``, ``"train_loss"``), per-parameter lists
    become ``"GradNorm/<parameter name>"`` and per-layer values ``"<key>/layers/<name>"``.
    """
    out = []
    for key, value in entries.items():
        if key in (log.LAYERS, log.FLAGS, log.BATCH):
            continue
        if is_scalar(value):
            out.append((key, float(value)))
        elif isinstance(value, list) and value and all(is_scalar(v) for v in value):
            out.extend((f"{key}/{name}", float(v)) for name, v in zip(_labels(names, len(value)), value))
    for key, values in entries.get(log.LAYERS, {}).items():
        labels = _labels(names, len(values))
        out.extend((f"{key}/layers/{name}", float(v)) for name, v in zip(labels, values) if is_scalar(v))
    return out


def histograms(entries, names):
    """The histogram values of ``entries`` as ``(tag, value)`` pairs (also per layer)."""
    out = [(key, value) for key, value in entries.items() if is_histogram(value)]
    for key, values in entries.get(log.LAYERS, {}).items():
        labels = _labels(names, len(values))
        out.extend((f"{key}/layers/{name}", v) for name, v in zip(labels, values) if is_histogram(v))
    return out


def _labels(names, n):
    names = list(names or [])
    return names[:n] if len(names) >= n else names + [f"param_{i}" for i in range(len(names), n)]
