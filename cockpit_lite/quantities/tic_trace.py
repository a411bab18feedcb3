"""``TICTrace``: Takeuchi information criterion with the curvature's trace (Thomas et al., 2020)."""

from cockpit_lite.quantities.base import Output, total_and_layers
from cockpit_lite.quantities.curvature import CurvatureQuantity
from cockpit_lite.transforms import SumGradSquared


class TICTrace(CurvatureQuantity):
    """``Σ_d [(1/B) Σ_n g̃_{n,d}²] / (tr C + ε)``, ε = ``epsilon``; ``C`` the curvature.

    Per layer: one parameter tensor's second moment over its own curvature trace.
    """

    TRANSFORMS = (SumGradSquared,)

    def __init__(self, track_schedule=None, verbose=False, curvature="diag_h", epsilon=1e-7):
        super().__init__(track_schedule, verbose, curvature)
        self.epsilon = epsilon

    def compute(self, step, data):
        b = data.batch_size
        total, layers = total_and_layers(
            lambda second_moment, trace: second_moment / (trace + self.epsilon),
            [sgs.sum() / b for sgs in data.per_sample(SumGradSquared.key)],
            [c.sum() for c in data.curvature(self.curvature)],
        )
        return Output(total, layers)
