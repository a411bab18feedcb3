"""``MeanGSNR``: mean gradient signal-to-noise ratio (Liu et al., 2020)."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.transforms import SumGrad, SumGradSquared, centred_sums_of_squares


class MeanGSNR(SingleStepQuantity):
    """Mean over parameter elements of ``g_d² / (σ_d² + ε)``.

    ``σ_d² = (1/B) Σ_n g̃_{n,d}² − g_d²`` is the population variance of the individual
    gradients (as Cockpit), ``ε`` = ``epsilon``. Per layer: the mean over one
    parameter tensor's elements. ``g_d = (1/B) Σ_n g̃_{n,d}`` is summed from the same
    individual gradients as ``Σ_n g̃_{n,d}²`` (see ``centred_sums_of_squares``); where
    the difference is below its rounding error the value is NaN with a flag.
    """

    MIN_BATCH_SIZE = 2  # a variance across samples

    TRANSFORMS = (SumGradSquared, SumGrad)

    def __init__(self, track_schedule=None, verbose=False, epsilon=1e-5):
        super().__init__(track_schedule, verbose)
        self.epsilon = epsilon

    def compute(self, step, data):
        b = data.batch_size
        centred, flags = centred_sums_of_squares(data, self.name)
        gsnr = [
            (s / b) ** 2 / (m2 / b + self.epsilon)
            for s, m2 in zip(data.per_sample(SumGrad.key), centred)
        ]
        total = sum(x.sum() for x in gsnr) / sum(x.numel() for x in gsnr)
        return Output(total, [x.mean() for x in gsnr], flags=flags)
