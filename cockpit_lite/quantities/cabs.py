"""``CABS``: the coupled adaptive batch size for SGD (Balles et al., 2017)."""

import torch

from cockpit_lite import intervals, subsample
from cockpit_lite.optim import plain_sgd_learning_rate
from cockpit_lite.quantities.base import Output, SingleStepQuantity, with_total
from cockpit_lite.engine.transforms import BatchL2, GradL2, SumGrad, SumGradSquared, centred_sums_of_squares


class CABS(SingleStepQuantity):
    """Suggested batch size ``η · Σ_d Σ_n (g̃_{n,d} − g_d)² / (B · L)`` for SGD with learning rate η.

    ``Σ_n (g̃_{n,d} − g_d)² = Σ_n g̃_{n,d}² − (Σ_n g̃_{n,d})² / B``, both sums of the same
    individual gradients (``centred_sums_of_squares``: under bf16 autocast autograd's g is
    rounded more than a variance). Defined for plain SGD (as in Cockpit). Per layer: the
    same sum over one parameter tensor.

    Subsampled (``k`` of ``B`` samples, ``cockpit_lite.subsample``): ``Σ_d Σ_n (g̃_{n,d} − g_d)²
    = Σ_n ‖g̃_n‖² − B ‖g‖²`` with the total estimated by ``(B/k) Σ_{n∈S} ‖g̃_n‖²`` (unbiased,
    ``‖g‖²`` from the engine's sum of all ``B`` individual gradients, ``GradL2``): the value is linear in it, its standard error in the ``meta``; a total of
    nonnegative terms ``Σ_n ‖g̃_n − g‖²``, so its interval is formed on the log scale
    (``"scale": "log"``, ``cockpit_lite.intervals``).
    """

    TIER = 1  # (overhead budget: per-sample)

    SCALED_BACKWARD = True

    INFO = ("optimizer", "loss")
    SUBSAMPLE = True
    TRANSFORMS = (SumGradSquared, SumGrad)
    SUBSAMPLE_TRANSFORMS = (BatchL2, GradL2)

    def _needs(self, step, info):
        plain_sgd_learning_rate(info.require("optimizer", self.name), self.name)
        return super()._needs(step, info)

    def compute(self, step, data):
        b = data.batch_size
        lr = plain_sgd_learning_rate(data.info.require("optimizer", self.name), self.name)
        loss = data.info.require("loss", self.name).detach()
        if data.subset is not None:
            scale = lr / (b * loss)
            t, se = subsample.total(with_total(torch.stack(data.per_sample(BatchL2.key), 1)), b)
            g2 = with_total(torch.stack(data.per_sample(GradL2.key)))
            return subsample.output(scale * (t - b * g2), scale.abs() * se, data.samples, b, scale=intervals.LOG)
        _, flags = centred_sums_of_squares(data, self.name)
        parts = data.centred_totals * (lr / (b * loss))
        return Output(parts.sum(), list(parts.unbind()), flags=flags)
