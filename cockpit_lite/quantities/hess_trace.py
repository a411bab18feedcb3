"""``HessTrace``: the trace of the loss curvature, per parameter tensor."""

from cockpit_lite.quantities.base import Output
from cockpit_lite.quantities.curvature import CurvatureQuantity
from cockpit_lite.utils.shards import totals


class HessTrace(CurvatureQuantity):
    """Per parameter tensor ``Σ_d C_dd``, a list; ``C`` the curvature (the Hessian by default).

    The whole-network trace is the sum of the list. With ``curvature="hutchinson"``
    each entry is ``mean_k z_kᵀ(H z_k)`` over the parameter's block (unbiased for
    ``tr H_pp``) and the record's ``meta`` holds its standard error.
    """

    SCALED_BACKWARD = True

    def parts(self, data, diagonal):
        layers = list(totals(diagonal))
        return sum(layers), layers

    def package(self, total, layers, meta):
        return Output(layers, meta=meta)
