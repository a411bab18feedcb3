"""``InputStats``: statistics of the model's first input at each step.

A forward pre-hook on the model reads its first floating-point positional input
``x`` of the training forward pass (gradients enabled; the first call of the step):
``mean``, ``std``, ``min``, ``max`` over all entries of its first ``SUB_BATCH`` samples
(along the first axis), and ``nonfinite``, the fraction of NaN/Inf entries among them
(the other statistics then skip them). A sub-batch: masking the non-finite entries
needs element-wise operations, on CPU 5-20x dearer than the reductions; a NaN in
another sample is still located by ``NonfiniteOrigin`` when it reaches the loss. Integer inputs (token ids)
are not floating-point and are not recorded. Reduced on the device, moved to the host
with the step's values.
"""

import torch

from cockpit_lite.quantities.base import Needs, Output, Quantity, input_module, user_forward

KEYS = ("mean", "std", "min", "max", "nonfinite")
SUB_BATCH = 16
"""Samples the statistics are computed on."""


class InputStats(Quantity):
    """``{"mean", "std", "min", "max", "nonfinite"}`` of the model's first input."""

    NEEDS_BACKWARD = False
    STATE = ("_next",)  # the next step's number, which the forward pre-hook reads

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._handle = None
        self._stats = None
        self._next = 0

    def watch(self, model):
        self._handle = input_module(model).register_forward_pre_hook(self._pre)

    def unbind(self):
        if self._handle is not None:
            self._handle.remove()
        self._handle, self._stats = None, None

    def _pre(self, module, args):
        if self._stats is not None or not user_forward() or not self.is_due(self._next):
            return None
        x = next((a for a in args if torch.is_tensor(a) and a.is_floating_point()), None)
        if x is None or x.numel() < 2:
            return None
        with torch.no_grad():
            self._stats = _statistics(x.detach())
        return None

    def needs(self, step, info):
        self._next = step + 1
        if not self.is_due(step):
            self._stats = None
            return None
        return Needs()

    def compute(self, step, data):
        stats, self._stats = self._stats, None
        if stats is None:
            return None
        return Output(dict(zip(KEYS, stats)))


def _statistics(x):
    x = (x[:SUB_BATCH] if x.dim() > 1 else x).float().reshape(-1)
    finite = torch.isfinite(x)
    share = 1.0 - finite.float().mean()
    values = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device))
    count = finite.sum().clamp(min=2)
    mean = values.sum() / count
    var = (torch.where(finite, x - mean, values) ** 2).sum() / (count - 1)
    big = torch.finfo(x.dtype).max
    low = torch.where(finite, x, torch.full((), big, device=x.device)).amin()
    high = torch.where(finite, x, torch.full((), -big, device=x.device)).amax()
    return [mean, var.sqrt(), low, high, share]
