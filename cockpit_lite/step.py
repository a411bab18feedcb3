"""``StepData``: everything a quantity may read after one step's backward pass."""

from functools import cached_property

import torch

from cockpit_lite import transforms as _transforms


class StepData:
    """The bundle handed to ``Quantity.compute``.

    Attributes:
        step: the global step.
        params: the tracked parameters (in order).
        names: their names.
        info: the step's ``StepInfo``.
        batch_size: B, from the individual gradients (``None`` when none were computed).
        grads: detached gradients of this backward pass, zeros for a parameter that got
            none. Under gradient accumulation (a gradient was present before the backward
            pass), the gradient of this backward pass alone, so that every quantity
            describes the same (micro-)batch.
    """

    def __init__(self, step, params, names, info, per_sample, batch_size, transforms, grads_before=None):
        self.step = step
        self.params = params
        self.names = names
        self.info = info
        self.batch_size = batch_size
        before = grads_before or [None] * len(params)
        self.accumulated = any(b is not None for b in before)
        self.grads = [
            torch.zeros_like(p) if p.grad is None
            else p.grad.detach() if b is None else p.grad.detach() - b
            for p, b in zip(params, before)
        ]
        self._per_sample = per_sample
        self._transforms = {t.key: t for t in transforms}

    @cached_property
    def grad_squared_norms(self):
        """``‖g‖²`` of every parameter (shared by the gradient tests)."""
        return [(g**2).sum() for g in self.grads]

    def per_sample(self, key):
        """Per-parameter values of the transform with ``key`` (see ``cockpit_lite.transforms``).

        A parameter that took no part in the forward pass has zero individual
        gradients; its value is computed from those zeros.
        """
        values = []
        for index, param in enumerate(self.params):
            results = self._per_sample.get(index)
            if results is None:
                zeros = torch.zeros((self.batch_size, *param.shape), dtype=param.dtype, device=param.device)
                per_sample = _transforms.PerSample(param, index, grad_batch=zeros)
                results = _transforms.run([self._transforms[key]], per_sample)
            values.append(results[key])
        return values

    def curvature(self, name):
        """Per-parameter diagonal curvature stored by BackPACK under ``name`` (detached).

        A parameter that took no part in the forward pass has zero curvature.
        """
        values = []
        for param in self.params:
            value = getattr(param, name, None)
            values.append(torch.zeros_like(param) if value is None else value.detach())
        return values
