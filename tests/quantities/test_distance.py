"""Distance against parameter snapshots."""

import pytest

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import Distance


def reference(problem, snapshots, step):
    first = min(snapshots)
    return [(p - p0).norm() for p, p0 in zip(snapshots[step].params, snapshots[first].params)]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES[::3], ids=problems.case_id)
def test_matches_snapshots(case):
    problems.check(Distance(), reference, case, layers=False)


def test_reference_point_is_first_step_seen_whatever_the_schedule():
    """θ_0 is taken at the first step even when the schedule starts later, and at any first step number."""
    quantity = Distance(track_schedule=schedules.linear(2, offset=7))
    problems.check(
        quantity, reference, ("mlp", 3, "mean"), steps=4, layers=False, first_step=5, schedule_steps=[7]
    )


def test_verbose_prints_each_value(capsys):
    problems.assert_prints_only_when_verbose(Distance, capsys)
