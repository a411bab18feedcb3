"""``GradVariance``: the total variance of the individual gradients, per parameter tensor."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.transforms import SumGradSquared


class GradVariance(SingleStepQuantity):
    """Per parameter tensor ``Σ_d σ̂_d²``, a list in parameter order.

    ``σ̂_d² = (Σ_n g̃_{n,d}² − B g_d²) / (B − 1)`` is the unbiased variance of element
    ``d`` over the batch, so each entry is the trace of that tensor's individual-
    gradient covariance; the whole-network value is the sum of the list. The
    variance of the mini-batch gradient is this divided by ``B``.
    """

    MIN_BATCH_SIZE = 2  # a variance across samples

    TRANSFORMS = (SumGradSquared,)

    def compute(self, step, data):
        b = data.batch_size
        return Output(
            [
                ((sgs - b * g**2).sum() / (b - 1))
                for g, sgs in zip(data.grads, data.per_sample(SumGradSquared.key))
            ]
        )
