"""``NormTest``: the norm test of Byrd et al. (2012) for the batch size."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity, total_and_layers
from cockpit_lite.transforms import BatchL2


class NormTest(SingleStepQuantity):
    """Norm test statistic.

    ``sqrt( Σ_n ‖g̃_n − g‖² / ((B − 1) B ‖g‖²) )`` with ``Σ_n ‖g̃_n − g‖² = Σ_n ‖g̃_n‖² − B ‖g‖²``.
    A value above 1 means the gradient noise exceeds the gradient: a larger batch
    would help. Per layer: the same statistic on one parameter tensor's gradient.
    """

    MIN_BATCH_SIZE = 2  # a variance across samples

    TRANSFORMS = (BatchL2,)

    def compute(self, step, data):
        b = data.batch_size

        def statistic(sum_l2, grad_l2):
            spread = (sum_l2 - b * grad_l2).clamp(min=0)
            return (spread / ((b - 1) * b * grad_l2)).sqrt()

        total, layers = total_and_layers(
            statistic,
            [l2.sum() for l2 in data.per_sample(BatchL2.key)],
            data.grad_squared_norms,
        )
        return Output(total, layers)
