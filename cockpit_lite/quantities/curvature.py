"""Base class of the quantities that read a diagonal curvature from BackPACK."""

from cockpit_lite.backend import curvature_extension
from cockpit_lite.quantities.base import Needs, SingleStepQuantity


class CurvatureQuantity(SingleStepQuantity):
    """A quantity using the diagonal of a curvature matrix of the mini-batch loss.

    ``curvature`` is ``"diag_h"`` (exact Hessian diagonal, BackPACK ``DiagHessian``,
    default), ``"diag_ggn_exact"`` (generalised Gauss-Newton diagonal, also for
    residual networks converted with ``extend(model, use_converter=True)``) or
    ``"diag_ggn_mc"`` (its Monte-Carlo estimate, cheapest).
    """

    def __init__(self, track_schedule=None, verbose=False, curvature="diag_h"):
        super().__init__(track_schedule, verbose)
        curvature_extension(curvature, self.name)  # fail early on a bad name
        self.curvature = curvature

    def _needs(self, step, info):
        base = super()._needs(step, info)
        return Needs(
            transforms=base.transforms,
            extensions=(curvature_extension(self.curvature, self.name),),
        )
