"""Base class of the Takeuchi information criterion quantities (Thomas et al., 2020)."""

from cockpit_lite.quantities.curvature import AUTO, CurvatureQuantity
from cockpit_lite.transforms import SumGradSquared


class TIC(CurvatureQuantity):
    """The gradient's uncentred second moment ``(1/B) Σ_n g̃_n²`` against a curvature.

    Subclasses combine ``second_moments(data)`` with the curvature; ``epsilon``
    guards the division.
    """

    TRANSFORMS = (SumGradSquared,)

    def __init__(self, track_schedule=None, verbose=False, curvature=AUTO, epsilon=1e-7, probes=16, seed=0):
        super().__init__(track_schedule, verbose, curvature, probes, seed)
        self.epsilon = epsilon

    @staticmethod
    def second_moments(data):
        """Per parameter ``(1/B) Σ_n g̃_n²`` elementwise."""
        return [sgs / data.batch_size for sgs in data.per_sample(SumGradSquared.key)]
