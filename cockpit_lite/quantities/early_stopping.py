"""``EarlyStopping``: the evidence-based early-stopping criterion (Mahsereci et al., 2017)."""

from cockpit_lite.optim import plain_sgd_learning_rate
from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.engine.transforms import SumGrad, SumGradSquared, centred_sums_of_squares, ratio_sums


class EarlyStopping(SingleStepQuantity):
    """``1 − B · mean_d [g_d² / (σ̂_d² + ε)]``, σ̂_d² = (Σ_n g̃_{n,d}² − B g_d²)/(B − 1).

    ``g_d = Σ_n g̃_{n,d} / B`` and σ̂² come from the same individual gradients
    (``centred_sums_of_squares``: under bf16 autocast autograd's g is rounded more than a
    variance).

    Stop when it turns positive: the gradient is then indistinguishable from noise.
    Defined for plain SGD (as in Cockpit). Per layer: the mean over one parameter tensor.
    """

    TIER = 1  # (overhead budget: per-sample)

    SCALED_BACKWARD = True

    MIN_BATCH_SIZE = 2  # a variance across samples

    INFO = ("optimizer",)
    TRANSFORMS = (SumGradSquared, SumGrad)

    def __init__(self, track_schedule=None, verbose=False, epsilon=1e-5):
        super().__init__(track_schedule, verbose)
        self.epsilon = epsilon

    def _needs(self, step, info):
        plain_sgd_learning_rate(info.require("optimizer", self.name), self.name)
        return super()._needs(step, info)

    def compute(self, step, data):
        b = data.batch_size
        centred, flags = centred_sums_of_squares(data, self.name)
        # (s/B)² / (M2/(B−1) + ε) = s² / (M2 + (B−1)ε) · (B−1)/B²
        sums = ratio_sums(data.per_sample(SumGrad.key), centred, (b - 1) * self.epsilon) * ((b - 1) / b**2)
        sizes = sums.new_tensor([p.numel() for p in data.params])
        return Output(1 - b * sums.sum() / sizes.sum(), list((1 - b * sums / sizes).unbind()), flags=flags)
