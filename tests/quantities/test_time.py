"""Time records the wall clock at each tracked step."""

import time

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import Time


def test_increasing_wall_clock_at_scheduled_steps():
    before = time.time()
    cp, _ = problems.run(problems.make("mlp", 2, steps=4), [Time(track_schedule=schedules.linear(2))])
    after = time.time()
    stamps = [cp.get_output()[s]["Time"] for s in (0, 2)]
    assert sorted(cp.get_output()) == [0, 2]
    assert before <= stamps[0] <= stamps[1] <= after
