"""Tracking schedules: functions ``step -> bool`` saying when a quantity is due.

Any callable taking the (integer) global step and returning a bool can serve as a
schedule; these two builders cover the usual cases and match Cockpit's.
"""

import numpy as np


def linear(interval, offset=0):
    """Track at steps ``{offset + n * interval | n >= 0}``.

    Args:
        interval: positive number of steps between two tracked steps.
        offset: first tracked step.

    Returns:
        A schedule ``step -> bool``.

    Raises:
        ValueError: if ``interval`` is not a positive integer.
    """
    if int(interval) != interval or interval < 1:
        raise ValueError(f"interval must be a positive integer, got {interval!r}")
    interval, offset = int(interval), int(offset)

    def schedule(global_step):
        shifted = global_step - offset
        return shifted >= 0 and shifted % interval == 0

    schedule.__doc__ = f"Track at steps {{{offset} + n * {interval} | n >= 0}}."
    return schedule


def logarithmic(start, end, steps=300, base=10, init=True):
    """Track at ``steps`` logarithmically spaced steps between ``base**start`` and ``base**end``.

    The tracked steps are the integer parts of ``numpy.logspace(start, end, steps,
    base=base)`` (duplicates collapse), plus step 0 when ``init`` is true.

    Args:
        start: exponent of the first tracked step.
        end: exponent of the last tracked step.
        steps: number of points in the log-spaced grid.
        base: base of the logarithm.
        init: also track step 0.

    Returns:
        A schedule ``step -> bool``.
    """
    tracked = {int(s) for s in np.logspace(start, end, steps, base=base)}
    if init:
        tracked.add(0)
    tracked = frozenset(tracked)

    def schedule(global_step):
        return global_step in tracked

    schedule.__doc__ = f"Track at the {len(tracked)} steps {sorted(tracked)[:5]}..."
    return schedule
