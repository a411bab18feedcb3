"""``InnerTest``: the inner product test of Bollapragada et al. (2017)."""

import torch

from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.transforms import BatchDotGrad


class InnerTest(SingleStepQuantity):
    """Inner product test statistic.

    ``sqrt( Var̂_n(g̃_nᵀ g) / (B ‖g‖⁴) )`` with the unbiased sample variance over the
    batch. Per layer: the same statistic on one parameter tensor (``g̃_n`` and ``g``
    restricted to it).
    """

    MIN_BATCH_SIZE = 2  # a variance across samples

    TRANSFORMS = (BatchDotGrad,)

    def compute(self, step, data):
        b = data.batch_size
        dots = data.per_sample(BatchDotGrad.key)
        grad_l2 = data.grad_squared_norms

        def statistic(projections, g2):
            return (projections.var() / (b * g2**2)).sqrt()

        layers = [statistic(d, g2) for d, g2 in zip(dots, grad_l2)]
        total = statistic(torch.stack(dots).sum(0), sum(grad_l2))
        return Output(total, layers)
