"""Per-sample transforms: reductions of one parameter's individual gradients.

A transform runs inside the backward pass, once per tracked parameter, right after
that parameter's individual gradients exist; it returns a small tensor and the
individual gradients are dropped. Quantities declare the transforms they need;
transforms with equal ``key`` are computed once per step and shared.

Notation (per parameter tensor, batch of B samples): BackPACK's ``grad_batch[n]`` is
sample n's contribution to the reduced loss, so ``grad_batch.sum(0)`` is the
gradient ``g``. The *individual gradient* is ``g̃_n = B · grad_batch[n]``, so that
``g = mean_n g̃_n`` for both ``reduction="mean"`` (then ``g̃_n = ∇ℓ_n``) and
``reduction="sum"`` (then ``g̃_n = B ∇ℓ_n``, the per-sample estimate of ``∇L``).
This is the convention of Cockpit's formulas. No transform calls ``.item()``.
"""

from functools import cached_property

import torch

from cockpit_lite import histogram


class PerSample:
    """The individual gradients of one parameter, and intermediates shared by transforms.

    Attributes:
        grad_batch: ``[B, *shape]`` contributions to the reduced loss (detached).
        param: the parameter tensor.
        index: position of the parameter in the Cockpit's parameter list.
    """

    def __init__(self, grad_batch, param, index):
        self.grad_batch = grad_batch
        self.param = param
        self.index = index

    @property
    def batch_size(self):
        return self.grad_batch.shape[0]

    @cached_property
    def flat(self):
        """``grad_batch`` as ``[B, D]``."""
        return self.grad_batch.reshape(self.batch_size, -1)

    @cached_property
    def grad(self):
        """The gradient ``g = Σ_n grad_batch[n]`` of this parameter, shape ``[D]``."""
        return self.flat.sum(0)


class Transform:
    """Base class. ``key`` identifies equal transforms; ``__call__`` computes one parameter's value."""

    key = None

    def __call__(self, per_sample):
        raise NotImplementedError


class BatchL2(Transform):
    """Squared norms of the individual gradients, ``‖g̃_n‖² = B² ‖grad_batch[n]‖²``, shape ``[B]``."""

    key = "batch_l2"

    def __call__(self, per_sample):
        b = per_sample.batch_size
        return (per_sample.flat**2).sum(1) * b**2


class BatchDotGrad(Transform):
    """Projections of the individual gradients on the gradient, ``g̃_nᵀ g``, shape ``[B]``."""

    key = "batch_dot_grad"

    def __call__(self, per_sample):
        return (per_sample.flat @ per_sample.grad) * per_sample.batch_size


class SumGradSquared(Transform):
    """Elementwise second moment sum, ``Σ_n g̃_n² = B² Σ_n grad_batch[n]²``, shape of the parameter."""

    key = "sum_grad_squared"

    def __call__(self, per_sample):
        b = per_sample.batch_size
        return (per_sample.grad_batch**2).sum(0) * b**2


class BatchDotDirection(Transform):
    """Projections ``g̃_nᵀ d`` of the individual gradients on a direction ``d``, shape ``[B]``.

    ``direction(per_sample)`` returns the parameter's slice of ``d`` (it may use
    ``per_sample.grad``, e.g. to predict an optimizer's update). ``key`` must be
    unique to the direction.
    """

    def __init__(self, key, direction):
        self.key = key
        self._direction = direction

    def __call__(self, per_sample):
        direction = self._direction(per_sample).reshape(-1).to(per_sample.flat.dtype)
        return (per_sample.flat @ direction) * per_sample.batch_size


class GradHistogram1d(Transform):
    """Histogram of all individual-gradient elements ``g̃_{n,d}``: ``(counts, clipped, nonfinite)``."""

    def __init__(self, bins, range):
        self.bins, self.range = int(bins), (float(range[0]), float(range[1]))
        self.key = ("grad_hist_1d", self.bins, self.range)

    def __call__(self, per_sample):
        return histogram.histogram1d(
            per_sample.grad_batch, self.bins, self.range, scale=float(per_sample.batch_size)
        )


class GradHistogram2d(Transform):
    """2-d histogram of pairs ``(g̃_{n,d}, θ_d)``: ``(counts, clipped, nonfinite)``."""

    def __init__(self, bins, range):
        self.bins = (int(bins[0]), int(bins[1]))
        self.range = tuple((float(lo), float(hi)) for lo, hi in range)
        self.key = ("grad_hist_2d", self.bins, self.range)

    def __call__(self, per_sample):
        return histogram.histogram2d(
            per_sample.grad_batch,
            per_sample.param.detach(),
            self.bins,
            self.range,
            scale=float(per_sample.batch_size),
        )


def run(transforms, grad_batch, param, index):
    """Compute every transform on one parameter's individual gradients.

    Returns:
        dict ``{transform.key: value}``.
    """
    with torch.no_grad():
        per_sample = PerSample(grad_batch.detach(), param, index)
        return {t.key: t(per_sample) for t in transforms}
