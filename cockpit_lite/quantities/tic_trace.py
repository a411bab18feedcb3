"""``TICTrace``: Takeuchi information criterion with the curvature's trace (Thomas et al., 2020)."""

import torch

from cockpit_lite.quantities.base import total_and_layers, with_total
from cockpit_lite.quantities.tic import TIC
from cockpit_lite.engine.transforms import BatchL2
from cockpit_lite.utils.shards import totals


class TICTrace(TIC):
    """``Σ_d [(1/B) Σ_n g̃_{n,d}²] / (tr C + ε)``, ε = ``epsilon``; ``C`` the curvature.

    Per layer: one parameter tensor's second moment over its own curvature trace.
    ``C`` is an exact diagonal (BackPACK's Hessian or GGN diagonal), else the value is
    NaN with a flag: see ``TIC``.

    Subsampled: the per-sample terms ``x_n = ‖g̃_n‖²`` of the drawn samples (of the whole
    network, and of each parameter tensor) over the exact ``tr C + ε``.
    """

    SUBSAMPLE_TRANSFORMS = (BatchL2,)

    def parts(self, data, diagonal):
        return total_and_layers(
            lambda moment, trace: moment / (trace + self.epsilon),
            list(totals(self.second_moments(data))),
            list(totals(diagonal)),
        )

    def sample_terms(self, data, diagonal):
        terms = with_total(torch.stack(data.per_sample(BatchL2.key), 1))
        traces = with_total(totals(diagonal).to(terms.dtype))
        return terms, traces + self.epsilon
