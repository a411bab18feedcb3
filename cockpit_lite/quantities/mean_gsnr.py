"""``MeanGSNR``: mean gradient signal-to-noise ratio (Liu et al., 2020)."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.engine.transforms import SumGrad, SumGradSquared, centred_sums_of_squares, ratio_sums


class MeanGSNR(SingleStepQuantity):
    """Mean over parameter elements of ``g_d² / (σ_d² + ε)``.

    ``σ_d² = (1/B) Σ_n g̃_{n,d}² − g_d²`` is the population variance of the individual
    gradients (as Cockpit), ``ε`` = ``epsilon``. Per layer: the mean over one
    parameter tensor's elements. ``g_d = (1/B) Σ_n g̃_{n,d}`` is summed from the same
    individual gradients as ``Σ_n g̃_{n,d}²`` (see ``centred_sums_of_squares``); where
    the difference is below its rounding error the value is NaN with a flag.
    """

    SCALED_BACKWARD = True

    MIN_BATCH_SIZE = 2  # a variance across samples

    TRANSFORMS = (SumGradSquared, SumGrad)

    def __init__(self, track_schedule=None, verbose=False, epsilon=1e-5):
        super().__init__(track_schedule, verbose)
        self.epsilon = epsilon

    def compute(self, step, data):
        b = data.batch_size
        centred, flags = centred_sums_of_squares(data, self.name)
        # (s/B)² / (M2/B + ε) = s² / (M2 + Bε) / B
        sums = ratio_sums(data.per_sample(SumGrad.key), centred, b * self.epsilon) / b
        sizes = sums.new_tensor([p.numel() for p in data.params])
        return Output(sums.sum() / sizes.sum(), list((sums / sizes).unbind()), flags=flags)
