"""``TICDiag``: Takeuchi information criterion with a diagonal curvature (Thomas et al., 2020)."""

from cockpit_lite.quantities.tic import TIC


class TICDiag(TIC):
    """``Σ_d [(1/B) Σ_n g̃_{n,d}²] / (C_dd + ε)``, ε = ``epsilon``; ``C`` the curvature.

    The gradient's uncentred second moment weighted by the inverse diagonal
    curvature, an approximation of ``tr(C⁻¹ G)``. Per layer: the sum over one
    parameter tensor (the total is the sum of the layers). ``C`` is an exact diagonal
    (BackPACK's Hessian or GGN diagonal), else the value is NaN with a flag: see ``TIC``.
    """

    def parts(self, data, diagonal):
        layers = [(m / (c + self.epsilon)).sum() for m, c in zip(self.second_moments(data), diagonal)]
        return sum(layers), layers
