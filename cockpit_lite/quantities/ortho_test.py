"""``OrthoTest``: the orthogonality test of Bollapragada et al. (2017)."""

import torch

from cockpit_lite import subsample
from cockpit_lite.quantities.base import Output, SingleStepQuantity, with_total
from cockpit_lite.transforms import BatchDotGrad, BatchL2


class OrthoTest(SingleStepQuantity):
    """Orthogonality test statistic.

    ``sqrt( Σ_n ‖g̃_n − (g̃_nᵀg / ‖g‖²) g‖² / ((B − 1) B ‖g‖²) )``, using
    ``Σ_n ‖g̃_n − c_n g‖² = Σ_n ‖g̃_n‖² − Σ_n (g̃_nᵀg)² / ‖g‖²``. Per layer: the same on
    one parameter tensor.

    Subsampled (``k`` of ``B`` samples, ``cockpit_lite.subsample``): the spread is the total
    of ``‖g̃_n‖² − (g̃_nᵀg)² / ‖g‖²`` (``g`` autograd's, exact), estimated by ``B/k`` times
    its sum over the subsample (unbiased); the square root's second-order bias removed, its
    standard error by the delta method (``subsample.sqrt_estimates``).
    """

    MIN_BATCH_SIZE = 2  # a variance across samples
    SUBSAMPLE = True

    TRANSFORMS = (BatchL2, BatchDotGrad)

    def compute(self, step, data):
        b = data.batch_size
        l2 = data.per_sample(BatchL2.key)
        dots = data.per_sample(BatchDotGrad.key)
        grad_l2 = data.grad_squared_norms
        if data.subset is not None:
            l, d = with_total(torch.stack(l2, 1)), with_total(torch.stack(dots, 1))
            g2 = with_total(torch.stack(grad_l2))
            return subsample.sqrt_estimates(l - d**2 / g2, b, torch.zeros_like(g2), (b - 1) * b * g2)

        def statistic(sum_l2, projections, g2):
            spread = (sum_l2 - (projections**2).sum() / g2).clamp(min=0)
            return (spread / ((b - 1) * b * g2)).sqrt()

        layers = [statistic(l.sum(), d, g2) for l, d, g2 in zip(l2, dots, grad_l2)]
        total = statistic(sum(l.sum() for l in l2), torch.stack(dots).sum(0), sum(grad_l2))
        return Output(total, layers)
