"""Base class of the Takeuchi information criterion quantities (Thomas et al., 2020)."""

from cockpit_lite.quantities.curvature import AUTO, CurvatureQuantity
from cockpit_lite.transforms import SumGradSquared


class TIC(CurvatureQuantity):
    """The gradient's uncentred second moment ``(1/B) Σ_n g̃_n²`` against a curvature ``C``.

    Subclasses combine ``second_moments(data)`` with the curvature; ``epsilon``
    guards the division.

    ``C`` is an exact diagonal only (``EXACT_ONLY``): BackPACK's Hessian diagonal
    (``curvature="diag_h"``, what ``"auto"`` takes where BackPACK supports the model and
    the loss) or the exact GGN diagonal (``"diag_ggn_exact"``). A ratio with an estimated
    denominator is not an estimate of the ratio: measured against the exact Hessian,
    TICs from Hutchinson's diagonal missed by 6.6-27 of their own jackknife standard
    errors on transformers, per-layer TICTrace by thousands, TICDiag came out negative
    (−2.1 against 213.6), and TICTrace was 2× off on a ReLU MLP. Where only an estimate
    could run (``"hutchinson"``, ``"diag_ggn_mc"``, or ``"auto"`` on a model BackPACK
    cannot serve) the value is NaN with a flag naming why and the fix; nothing is computed
    for it and no graph is kept.
    """

    EXACT_ONLY = True
    TRANSFORMS = (SumGradSquared,)

    def __init__(self, track_schedule=None, verbose=False, curvature=AUTO, epsilon=1e-7):
        """
        Args:
            curvature: one of ``CHOICES`` (only ``"auto"``, ``"diag_h"`` and
                ``"diag_ggn_exact"`` give values).
            epsilon: added to the curvature in the denominator.
        """
        super().__init__(track_schedule, verbose, curvature)
        self.epsilon = epsilon

    @staticmethod
    def second_moments(data):
        """Per parameter ``(1/B) Σ_n g̃_n²`` elementwise."""
        return [sgs / data.batch_size for sgs in data.per_sample(SumGradSquared.key)]
