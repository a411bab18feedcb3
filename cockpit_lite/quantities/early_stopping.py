"""``EarlyStopping``: the evidence-based early-stopping criterion (Mahsereci et al., 2017)."""

from cockpit_lite.optim import plain_sgd_learning_rate
from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.transforms import SumGradSquared


class EarlyStopping(SingleStepQuantity):
    """``1 − B · mean_d [g_d² / (σ̂_d² + ε)]``, σ̂_d² = (Σ_n g̃_{n,d}² − B g_d²)/(B − 1).

    Stop when it turns positive: the gradient is then indistinguishable from noise.
    Defined for plain SGD (as in Cockpit). Per layer: the mean over one parameter tensor.
    """

    MIN_BATCH_SIZE = 2  # a variance across samples

    INFO = ("optimizer",)
    TRANSFORMS = (SumGradSquared,)

    def __init__(self, track_schedule=None, verbose=False, epsilon=1e-5):
        super().__init__(track_schedule, verbose)
        self.epsilon = epsilon

    def _needs(self, step, info):
        plain_sgd_learning_rate(info.require("optimizer", self.name), self.name)
        return super()._needs(step, info)

    def compute(self, step, data):
        b = data.batch_size
        snr = [
            g**2 / ((sgs - b * g**2) / (b - 1) + self.epsilon)
            for g, sgs in zip(data.grads, data.per_sample(SumGradSquared.key))
        ]
        mean = sum(s.sum() for s in snr) / sum(s.numel() for s in snr)
        return Output(1 - b * mean, [1 - b * s.mean() for s in snr])
