"""``TICDiag``: Takeuchi information criterion with a diagonal curvature (Thomas et al., 2020)."""

import torch

from cockpit_lite.quantities.base import with_total
from cockpit_lite.quantities.tic import TIC
from cockpit_lite.engine.transforms import IndividualSquares
from cockpit_lite.utils.shards import totals


class TICDiag(TIC):
    """``Σ_d [(1/B) Σ_n g̃_{n,d}²] / (C_dd + ε)``, ε = ``epsilon``; ``C`` the curvature.

    The gradient's uncentred second moment weighted by the inverse diagonal
    curvature, an approximation of ``tr(C⁻¹ G)``. Per layer: the sum over one
    parameter tensor (the total is the sum of the layers). ``C`` is an exact diagonal
    (BackPACK's Hessian or GGN diagonal), else the value is NaN with a flag: see ``TIC``.

    Subsampled: the per-sample terms ``x_n = Σ_d g̃_{n,d}² / (C_dd + ε)`` of the drawn samples.
    ``C`` comes out of the same backward pass as the individual gradients, so their squares are
    kept until it is known (``IndividualSquares``: ``k ×`` the model's size).
    """

    SUBSAMPLE_TRANSFORMS = (IndividualSquares,)

    def parts(self, data, diagonal):
        layers = list(totals(m / (c + self.epsilon) for m, c in zip(self.second_moments(data), diagonal)))
        return sum(layers), layers

    def sample_terms(self, data, diagonal):
        squares = data.per_sample(IndividualSquares.key)
        terms = torch.stack([
            s.reshape(s.shape[0], -1) @ (1 / (c.to(s.dtype) + self.epsilon)).reshape(-1)
            for s, c in zip(squares, diagonal)
        ], 1)
        return with_total(terms), terms.new_ones(terms.shape[1] + 1)
