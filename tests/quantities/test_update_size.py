"""UpdateSize against parameter snapshots (a two-step quantity, recorded under the first step)."""

import pytest

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import UpdateSize


def reference(problem, snapshots, step):
    return [(p1 - p0).norm() for p1, p0 in zip(snapshots[step + 1].params, snapshots[step].params)]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES[::3], ids=problems.case_id)
def test_matches_snapshots(case):
    problems.check(UpdateSize(), reference, case, steps=4, layers=False, schedule_steps=[0, 1, 2])


def test_schedule_and_momentum_optimizer():
    """Only scheduled steps are recorded; the update is whatever the optimizer did."""
    import torch

    quantity = UpdateSize(track_schedule=schedules.linear(2))
    problems.check(
        quantity,
        reference,
        ("cnn", 2, "sum"),
        steps=5,
        layers=False,
        schedule_steps=[0, 2],
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    )


def test_verbose_prints_each_value(capsys):
    problems.assert_prints_only_when_verbose(UpdateSize, capsys)
