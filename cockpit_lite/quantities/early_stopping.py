"""``EarlyStopping``: the evidence-based early-stopping criterion (Mahsereci et al., 2017)."""

from cockpit_lite.optim import plain_sgd_learning_rate
from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.transforms import SumGrad, SumGradSquared, centred_sums_of_squares


class EarlyStopping(SingleStepQuantity):
    """``1 − B · mean_d [g_d² / (σ̂_d² + ε)]``, σ̂_d² = (Σ_n g̃_{n,d}² − B g_d²)/(B − 1).

    ``g_d = Σ_n g̃_{n,d} / B`` and σ̂² come from the same individual gradients
    (``centred_sums_of_squares``: under bf16 autocast autograd's g is rounded more than a
    variance).

    Stop when it turns positive: the gradient is then indistinguishable from noise.
    Defined for plain SGD (as in Cockpit). Per layer: the mean over one parameter tensor.
    """

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
        snr = [
            (s / b) ** 2 / (m2 / (b - 1) + self.epsilon)
            for s, m2 in zip(data.per_sample(SumGrad.key), centred)
        ]
        mean = sum(s.sum() for s in snr) / sum(s.numel() for s in snr)
        return Output(1 - b * mean, [1 - b * s.mean() for s in snr], flags=flags)
