"""``GradVariance``: the total variance of the individual gradients, per parameter tensor."""

import torch

from cockpit_lite import intervals, subsample
from cockpit_lite.quantities.base import Output, SingleStepQuantity, with_total
from cockpit_lite.engine.transforms import BatchL2, GradL2, SumGrad, SumGradSquared, centred_sums_of_squares
from cockpit_lite.utils.shards import totals


class GradVariance(SingleStepQuantity):
    """Per parameter tensor ``Σ_d σ̂_d²``, a list in parameter order.

    ``σ̂_d² = (Σ_n g̃_{n,d}² − B g_d²) / (B − 1)`` is the unbiased variance of element
    ``d`` over the batch, so each entry is the trace of that tensor's individual-
    gradient covariance; the whole-network value is the sum of the list. The
    variance of the mini-batch gradient is this divided by ``B``. ``g_d`` is summed
    from the same individual gradients as ``Σ_n g̃_{n,d}²`` (see
    ``centred_sums_of_squares``); a tensor with an element whose difference is below its
    rounding (negative), or whose sum ``Σ_d M2_d`` is below the rounding level of
    ``Σ_n ‖g̃_n‖²`` (``StepData.resolved``, as the gradient tests), is NaN with a flag.

    Subsampled (``k`` of ``B`` samples, ``cockpit_lite.subsample``): ``Σ_d σ̂_d² =
    (Σ_n ‖g̃_n‖² − B ‖g‖²) / (B − 1)`` with ``Σ_n ‖g̃_n‖²`` estimated by ``(B/k) Σ_{n∈S} ‖g̃_n‖²``
    (unbiased) and ``‖g‖²`` from the engine's sum of all ``B`` individual gradients (``GradL2``:
    the same precision, not autograd's bf16-rounded gradient under autocast); clamped at 0 (biased only within about a standard
    error of 0). The ``meta``'s ``"se"`` is the list of the entries' standard errors,
    ``"total_se"`` that of their sum (the entries share the samples: not the root of the
    sum of their squares). Each entry estimates a total of nonnegative terms, ``Σ_n ‖g̃_n − g‖²``
    over ``B − 1``: its interval is formed on the log scale (``"scale": "log"``,
    ``cockpit_lite.intervals``), on ``"df"`` = k − 1 degrees of freedom.
    """

    SCALED_BACKWARD = True

    MIN_BATCH_SIZE = 2  # a variance across samples
    SUBSAMPLE = True

    TRANSFORMS = (SumGradSquared, SumGrad)
    SUBSAMPLE_TRANSFORMS = (BatchL2, GradL2)

    def compute(self, step, data):
        b = data.batch_size
        if data.subset is not None:
            t, se = subsample.total(with_total(torch.stack(data.per_sample(BatchL2.key), 1)), b)
            values = ((t[1:] - b * torch.stack(data.per_sample(GradL2.key))) / (b - 1)).clamp(min=0)
            meta = subsample.meta(data.samples, b, list((se[1:] / (b - 1)).unbind()), scale=intervals.LOG)
            meta["total_se"] = se[0] / (b - 1)
            return data.without_noise(self.name, Output(list(values.unbind()), meta=meta))
        _, flags = centred_sums_of_squares(data, self.name)
        centred = data.centred_totals
        terms = totals(data.per_sample(SumGradSquared.key))
        values, lost = data.resolved(self.name, "the variance Σ_n ‖g̃_n − g‖² = Σ_n ‖g̃_n‖² − B ‖g‖² (a gradient "
                                     "nearly the same in every sample)", centred / (b - 1), centred, terms, total=False)
        return Output(list(values.unbind()), flags=flags + lost)
