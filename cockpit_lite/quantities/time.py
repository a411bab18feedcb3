"""``Time``: wall-clock time of the step."""

import time

from cockpit_lite.quantities.base import Output, SingleStepQuantity


class Time(SingleStepQuantity):
    """``time.time()`` when the step's backward pass has finished (seconds since the epoch)."""

    NEEDS_BACKWARD = False

    def compute(self, step, data):
        return Output(time.time())
