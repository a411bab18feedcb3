"""``OrthoTest``: the orthogonality test of Bollapragada et al. (2017)."""

import torch

from cockpit_lite import subsample
from cockpit_lite.quantities.base import Output, SingleStepQuantity, with_total
from cockpit_lite.engine.transforms import BatchDotGrad, BatchL2, GradL2


class OrthoTest(SingleStepQuantity):
    """Orthogonality test statistic.

    ``sqrt( Σ_n ‖g̃_n − (g̃_nᵀg / ‖g‖²) g‖² / ((B − 1) B ‖g‖²) )``, using
    ``Σ_n ‖g̃_n − c_n g‖² = Σ_n ‖g̃_n‖² − Σ_n (g̃_nᵀg)² / ‖g‖²``. Per layer: the same on
    one parameter tensor. ``g`` is the sum of the same individual gradients (``GradL2``, and
    in ``BatchDotGrad``): under bf16 autocast autograd's gradient, rounded to 2⁻⁸, made the
    spread of a high-SNR bias negative. A spread below the rounding of ``Σ_n ‖g̃_n‖²``
    (``StepData.resolved``) is NaN with a flag.

    Subsampled (``k`` of ``B`` samples, ``cockpit_lite.subsample``): the spread is the total
    of ``‖g̃_n‖² − (g̃_nᵀg)² / ‖g‖²`` (``g`` autograd's, exact), estimated by ``B/k`` times
    its sum over the subsample (unbiased); the square root's bias removed by the jackknife, its
    standard error by the delta method (``subsample.sqrt_estimates``; its interval on the log
    scale, ``cockpit_lite.intervals``).
    """

    MIN_BATCH_SIZE = 2  # a variance across samples
    SUBSAMPLE = True

    TRANSFORMS = (BatchL2, BatchDotGrad, GradL2)
    SUBSAMPLE_TRANSFORMS = (BatchL2, BatchDotGrad)

    def compute(self, step, data):
        b = data.batch_size
        l2 = data.per_sample(BatchL2.key)
        dots = data.per_sample(BatchDotGrad.key)
        if data.subset is not None:
            g2 = with_total(torch.stack(data.grad_squared_norms))
            l, d = with_total(torch.stack(l2, 1)), with_total(torch.stack(dots, 1))
            return data.without_noise(self.name, subsample.sqrt_estimates(l - d**2 / g2, b, torch.zeros_like(g2),
                                                                          (b - 1) * b * g2))

        g2 = with_total(torch.stack(data.per_sample(GradL2.key)))
        sum_l2 = with_total(torch.stack([l.sum() for l in l2]))
        projections = with_total(torch.stack(dots, 1))
        spread = sum_l2 - (projections**2).sum(0) / g2
        values = (spread.clamp(min=0) / ((b - 1) * b * g2)).sqrt()
        values, flags = data.resolved(self.name, "the spread Σ_n ‖g̃_n‖² − Σ_n (g̃_nᵀg)² / ‖g‖² (individual "
                                      "gradients nearly collinear)", values, spread, sum_l2)
        return Output(values[0], list(values[1:].unbind()), flags=flags)
