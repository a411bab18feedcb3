"""``InnerTest``: the inner product test of Bollapragada et al. (2017)."""

import torch

from cockpit_lite import subsample
from cockpit_lite.quantities.base import Output, SingleStepQuantity, with_total
from cockpit_lite.engine.transforms import BatchDotGrad


class InnerTest(SingleStepQuantity):
    """Inner product test statistic.

    ``sqrt( Var̂_n(g̃_nᵀ g) / (B ‖g‖⁴) )`` with the unbiased sample variance over the
    batch. Per layer: the same statistic on one parameter tensor (``g̃_n`` and ``g``
    restricted to it). The variance is formed from the projections themselves, so it is
    lost only when their spread ``‖p − p̄‖ = √((B − 1) Var̂)`` is below their own rounding,
    relative to ``‖p‖`` (``StepData.resolved``: NaN with a flag), not already when
    ``Var̂`` is below the rounding of ``Σ_n p_n²``.

    Subsampled (``k`` of ``B`` samples, ``cockpit_lite.subsample``): the batch mean of
    ``g̃_nᵀg`` is ``‖g‖²`` (autograd's, exact), so ``(B − 1) Var̂_n = Σ_n (g̃_nᵀg − ‖g‖²)²``
    is a total, estimated by ``(B/k) Σ_{n∈S} (g̃_nᵀg − ‖g‖²)²`` (unbiased); the standard error
    of the square root by the delta method, the root's bias removed by the jackknife
    (``subsample.sqrt_estimates``; its interval on the log scale, ``cockpit_lite.intervals``).
    """

    MIN_BATCH_SIZE = 2  # a variance across samples
    SUBSAMPLE = True

    TRANSFORMS = (BatchDotGrad,)

    def compute(self, step, data):
        b = data.batch_size
        dots = data.per_sample(BatchDotGrad.key)
        grad_l2 = data.grad_squared_norms
        if data.subset is not None:
            d, g2 = with_total(torch.stack(dots, 1)), with_total(torch.stack(grad_l2))
            return data.without_noise(self.name, subsample.sqrt_estimates((d - g2) ** 2, b, torch.zeros_like(g2),
                                                                          (b - 1) * b * g2**2))

        projections, g2 = with_total(torch.stack(dots, 1)), with_total(torch.stack(grad_l2))
        variance = projections.var(0)
        values = (variance / (b * g2**2)).sqrt()
        values, flags = data.resolved(self.name, "the spread ‖p − p̄‖ of the projections p_n = g̃_nᵀg (nearly "
                                      "the same in every sample)", values, ((b - 1) * variance).sqrt(),
                                      projections.norm(dim=0))
        return Output(values[0], list(values[1:].unbind()), flags=flags)
