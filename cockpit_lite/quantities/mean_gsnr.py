"""``MeanGSNR``: mean gradient signal-to-noise ratio (Liu et al., 2020)."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.transforms import SumGradSquared


class MeanGSNR(SingleStepQuantity):
    """Mean over parameter elements of ``g_d² / (σ_d² + ε)``.

    ``σ_d² = (1/B) Σ_n g̃_{n,d}² − g_d²`` is the population variance of the individual
    gradients (as Cockpit), ``ε`` = ``epsilon``. Per layer: the mean over one
    parameter tensor's elements.
    """

    MIN_BATCH_SIZE = 2  # a variance across samples

    TRANSFORMS = (SumGradSquared,)

    def __init__(self, track_schedule=None, verbose=False, epsilon=1e-5):
        super().__init__(track_schedule, verbose)
        self.epsilon = epsilon

    def compute(self, step, data):
        b = data.batch_size
        gsnr = [
            g**2 / (sgs / b - g**2 + self.epsilon)
            for g, sgs in zip(data.grads, data.per_sample(SumGradSquared.key))
        ]
        total = sum(x.sum() for x in gsnr) / sum(x.numel() for x in gsnr)
        return Output(total, [x.mean() for x in gsnr])
