"""``Distance``: how far each parameter tensor has moved from where tracking started."""

from cockpit_lite.quantities.base import Needs, Output, Quantity
from cockpit_lite.utils.norms import norms


class Distance(Quantity):
    """Per parameter tensor ``‖θ_t − θ_0‖₂``, a list in parameter order.

    ``θ_0`` is the parameters' value at the first step the Cockpit sees (Cockpit
    used step 0 only), whatever the schedule; it is kept as one copy of the
    parameters. That copy is the quantity's saved state (``STATE``), so a resumed run
    measures from the same ``θ_0``.
    """

    TIER = 0  # (overhead budget: bookkeeping)

    NEEDS_BACKWARD = False
    STATE = ("_initial",)

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._initial = None

    def needs(self, step, info):
        if self._initial is None or self.is_due(step):
            return Needs()
        return None

    def compute(self, step, data):
        if self._initial is None:
            self._initial = [p.detach().clone() for p in data.params]
        if self.is_due(step):
            return Output(norms(p.detach() - p0 for p, p0 in zip(data.params, self._initial)))
        return None
