"""``TICDiag``: Takeuchi information criterion with a diagonal curvature (Thomas et al., 2020)."""

from cockpit_lite.quantities.base import Output
from cockpit_lite.quantities.curvature import CurvatureQuantity
from cockpit_lite.transforms import SumGradSquared


class TICDiag(CurvatureQuantity):
    """``Σ_d [(1/B) Σ_n g̃_{n,d}²] / (C_dd + ε)``, ε = ``epsilon``; ``C`` the curvature.

    The gradient's uncentred second moment weighted by the inverse diagonal
    curvature, an approximation of ``tr(C⁻¹ G)``. Per layer: the sum over one
    parameter tensor (the total is the sum of the layers).
    """

    TRANSFORMS = (SumGradSquared,)

    def __init__(self, track_schedule=None, verbose=False, curvature="diag_h", epsilon=1e-7):
        super().__init__(track_schedule, verbose, curvature)
        self.epsilon = epsilon

    def compute(self, step, data):
        b = data.batch_size
        parts = [
            (sgs / b / (c + self.epsilon)).sum()
            for sgs, c in zip(data.per_sample(SumGradSquared.key), data.curvature(self.curvature))
        ]
        return Output(sum(parts), parts)
