"""``CABS``: the coupled adaptive batch size for SGD (Balles et al., 2017)."""

from cockpit_lite.optim import plain_sgd_learning_rate
from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.transforms import SumGradSquared


class CABS(SingleStepQuantity):
    """Suggested batch size ``η · Σ_d Σ_n (g̃_{n,d} − g_d)² / (B · L)`` for SGD with learning rate η.

    ``Σ_n (g̃_{n,d} − g_d)² = Σ_n g̃_{n,d}² − B g_d²``. Defined for plain SGD (as in
    Cockpit). Per layer: the same sum over one parameter tensor.
    """

    INFO = ("optimizer", "loss")
    TRANSFORMS = (SumGradSquared,)

    def _needs(self, step, info):
        plain_sgd_learning_rate(info.require("optimizer", self.name), self.name)
        return super()._needs(step, info)

    def compute(self, step, data):
        b = data.batch_size
        lr = plain_sgd_learning_rate(data.info.require("optimizer", self.name), self.name)
        loss = data.info.require("loss", self.name).detach()
        parts = [
            lr * (sgs - b * g**2).sum() / (b * loss)
            for g, sgs in zip(data.grads, data.per_sample(SumGradSquared.key))
        ]
        return Output(sum(parts), parts)
