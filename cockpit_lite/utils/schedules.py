"""Cockpit's path to the tracking schedules (``cockpit.utils.schedules``); they live in
:mod:`cockpit_lite.schedules`."""

from cockpit_lite.schedules import linear, logarithmic

__all__ = ["linear", "logarithmic"]
