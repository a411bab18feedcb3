"""``NormTest``: the norm test of Byrd et al. (2012) for the batch size."""

import torch

from cockpit_lite import subsample
from cockpit_lite.quantities.base import Output, SingleStepQuantity, with_total
from cockpit_lite.engine.transforms import BatchL2, GradL2


class NormTest(SingleStepQuantity):
    """Norm test statistic.

    ``sqrt( Σ_n ‖g̃_n − g‖² / ((B − 1) B ‖g‖²) )`` with ``Σ_n ‖g̃_n − g‖² = Σ_n ‖g̃_n‖² − B ‖g‖²``.
    A value above 1 means the gradient noise exceeds the gradient: a larger batch
    would help. Per layer: the same statistic on one parameter tensor's gradient. ``g`` is the
    sum of the same individual gradients (``GradL2``): under bf16 autocast autograd's gradient is
    rounded to 2⁻⁸, and the difference with it was 8× the spread of a high-SNR bias. A spread
    below the rounding of ``Σ_n ‖g̃_n‖²`` (``StepData.resolved``) is NaN with a flag.

    Subsampled (``k`` of ``B`` samples, ``cockpit_lite.subsample``): ``Σ_n ‖g̃_n‖²`` is
    estimated by ``(B/k) Σ_{n∈S} ‖g̃_n‖²`` (unbiased), ``‖g‖²`` is autograd's (exact); the
    square root with its bias removed by the jackknife, its standard error by the delta method
    (``subsample.sqrt_estimates``; its interval on the log scale, ``cockpit_lite.intervals``).
    """

    MIN_BATCH_SIZE = 2  # a variance across samples
    SUBSAMPLE = True

    TRANSFORMS = (BatchL2, GradL2)
    SUBSAMPLE_TRANSFORMS = (BatchL2,)

    def compute(self, step, data):
        b = data.batch_size
        l2 = data.per_sample(BatchL2.key)
        if data.subset is not None:
            x, g2 = with_total(torch.stack(l2, 1)), with_total(torch.stack(data.grad_squared_norms))
            return data.without_noise(self.name, subsample.sqrt_estimates(x, b, b * g2, (b - 1) * b * g2))

        sum_l2, grad_l2 = with_total(torch.stack(l2).sum(1)), with_total(torch.stack(data.per_sample(GradL2.key)))
        spread = sum_l2 - b * grad_l2
        values = (spread.clamp(min=0) / ((b - 1) * b * grad_l2)).sqrt()
        values, flags = data.resolved(self.name, "the spread Σ_n ‖g̃_n‖² − B ‖g‖² (individual gradients nearly "
                                      "the same)", values, spread, sum_l2)
        return Output(values[0], list(values[1:].unbind()), flags=flags)

