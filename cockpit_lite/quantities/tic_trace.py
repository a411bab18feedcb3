"""``TICTrace``: Takeuchi information criterion with the curvature's trace (Thomas et al., 2020)."""

from cockpit_lite.quantities.base import total_and_layers
from cockpit_lite.quantities.tic import TIC


class TICTrace(TIC):
    """``Σ_d [(1/B) Σ_n g̃_{n,d}²] / (tr C + ε)``, ε = ``epsilon``; ``C`` the curvature.

    Per layer: one parameter tensor's second moment over its own curvature trace.
    ``C`` is an exact diagonal (BackPACK's Hessian or GGN diagonal), else the value is
    NaN with a flag: see ``TIC``.
    """

    def parts(self, data, diagonal):
        return total_and_layers(
            lambda moment, trace: moment / (trace + self.epsilon),
            [m.sum() for m in self.second_moments(data)],
            [c.sum() for c in diagonal],
        )
