"""``GradVariance``: the total variance of the individual gradients, per parameter tensor."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.transforms import SumGrad, SumGradSquared, centred_sums_of_squares


class GradVariance(SingleStepQuantity):
    """Per parameter tensor ``Σ_d σ̂_d²``, a list in parameter order.

    ``σ̂_d² = (Σ_n g̃_{n,d}² − B g_d²) / (B − 1)`` is the unbiased variance of element
    ``d`` over the batch, so each entry is the trace of that tensor's individual-
    gradient covariance; the whole-network value is the sum of the list. The
    variance of the mini-batch gradient is this divided by ``B``. ``g_d`` is summed
    from the same individual gradients as ``Σ_n g̃_{n,d}²`` (see
    ``centred_sums_of_squares``); a tensor whose difference is below its rounding
    error is NaN with a flag.
    """

    MIN_BATCH_SIZE = 2  # a variance across samples

    TRANSFORMS = (SumGradSquared, SumGrad)

    def compute(self, step, data):
        centred, flags = centred_sums_of_squares(data, self.name)
        return Output([m2.sum() / (data.batch_size - 1) for m2 in centred], flags=flags)
