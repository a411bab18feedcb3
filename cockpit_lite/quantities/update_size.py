"""``UpdateSize``: the length of the optimizer's step for each parameter tensor."""

from cockpit_lite.quantities.base import Needs, Output, Quantity
from cockpit_lite.utils.norms import norms


class UpdateSize(Quantity):
    """Per parameter tensor ``‖θ_{t+1} − θ_t‖₂``, a list, recorded under step ``t``.

    Two-step quantity: at a due step ``t`` the parameters are copied; at step
    ``t + 1`` the difference is taken. Step numbers must be consecutive for a value
    to appear (a copy older than the previous step is dropped). The copy is the saved
    state (``STATE``): a run resumed after step ``t`` records the value of step ``t``.
    """

    TIER = 0  # (overhead budget: bookkeeping)

    NEEDS_BACKWARD = False
    STATE = ("_start",)

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._start = None

    def needs(self, step, info):
        if self._start is not None or self.is_due(step):
            return Needs()
        return None

    def compute(self, step, data):
        output = None
        if self._start is not None and self._start[0] == step - 1:
            output = Output(
                norms(p.detach() - p0 for p, p0 in zip(data.params, self._start[1])),
                step=step - 1,
            )
        self._start = (step, data.params_copy) if self.is_due(step) else None
        return output
