"""``HessTrace``: the trace of the loss curvature, per parameter tensor."""

from cockpit_lite.quantities.base import Output
from cockpit_lite.quantities.curvature import CurvatureQuantity


class HessTrace(CurvatureQuantity):
    """Per parameter tensor ``Σ_d C_dd``, a list; ``C`` the curvature (Hessian by default).

    The whole-network trace is the sum of the list.
    """

    def compute(self, step, data):
        return Output([c.sum() for c in data.curvature(self.curvature)])
