"""Cockpit's import paths: ``cockpit_lite.utils.configuration`` and ``cockpit_lite.utils.schedules``.

A Cockpit script's ``from cockpit.utils.configuration import configuration`` and
``from cockpit.utils import schedules`` port by renaming ``cockpit`` to ``cockpit_lite``.
``cockpit_lite.configuration`` is always the *function* (the module lives here).
"""
