"""Tracking schedules."""

import numpy as np
import pytest

from cockpit_lite import schedules


def test_linear():
    schedule = schedules.linear(3, offset=2)
    assert [s for s in range(12) if schedule(s)] == [2, 5, 8, 11]
    with pytest.raises(ValueError, match="positive integer"):
        schedules.linear(0)


def test_logarithmic_tracks_integer_parts_of_logspace_and_step_zero():
    schedule = schedules.logarithmic(0, 3, steps=10)
    expected = {0} | {int(v) for v in np.logspace(0, 3, 10)}
    assert {s for s in range(2000) if schedule(s)} == expected
    assert not schedules.logarithmic(1, 2, steps=5, init=False)(0)


def test_matches_cockpit_linear_schedule():
    cockpit_schedules = pytest.importorskip("cockpit.utils.schedules")
    ours, theirs = schedules.linear(4, offset=1), cockpit_schedules.linear(4, offset=1)
    assert [ours(s) for s in range(40)] == [theirs(s) for s in range(40)]
