"""Bin adaptation: policies that move a histogram's range during training (Cockpit's ``adapt=``).

A policy has its own schedule. At a step where it is due, the histogram that owns it
first records its value with the current range, then asks the policy for the new
limits, which apply from the next histogram on (Cockpit's order). The ``_AbsMax``
policies set the range to ``[-m', m']`` with ``m' = (1 + padding) · max(min_size / 2, m)``:

- ``GradAbsMax``: ``m = max_{n,d} |g̃_{n,d}|``, the largest individual-gradient element
  (``g̃_n = B · grad_batch[n]``, the histogram's own scale), from a per-sample transform;
- ``ParamAbsMax``: ``m = max_d |θ_d|``, the largest parameter element.

A non-finite ``m`` (a NaN gradient) leaves the range as it is.
"""

import math

import torch

from cockpit_lite import schedules
from cockpit_lite.engine.transforms import Transform
from cockpit_lite.utils import shards


class IndividualGradAbsMax(Transform):
    """``max_{n,d} |g̃_{n,d}|`` of one parameter, a 0-d tensor (NaN if an element is NaN)."""

    key = "grad_abs_max"
    summed_over_ranks = False

    def __call__(self, per_sample):
        _, chunks = per_sample.nonzero_element_chunks()  # left-out exact zeros cannot be the maximum
        maxima = [chunk.abs().amax() for chunk in chunks if chunk.numel()]
        if not maxima:
            return per_sample.param.new_zeros(())
        return torch.stack(maxima).amax() * per_sample.batch_size

    def combine(self, values):
        return torch.stack(values).amax()


class BinAdaptation:
    """Base class: a schedule, the transforms a due step needs, and ``limits``."""

    TRANSFORMS = ()

    def __init__(self, track_schedule, verbose=False):
        """
        Args:
            track_schedule: callable ``step -> bool``: when to adapt.
            verbose: print the new limits.
        """
        self._track_schedule = track_schedule
        self._verbose = verbose

    def is_due(self, step):
        """Whether the range adapts after ``step``."""
        return bool(self._track_schedule(step))

    def transforms(self):
        """New instances of the per-sample transforms a due step needs."""
        return tuple(t() for t in self.TRANSFORMS)

    def limits(self, step, data, current):
        """The new ``(start, end)`` from a due step's ``data`` (a ``StepData``); ``current`` if not finite."""
        raise NotImplementedError


class NoAdaptation(BinAdaptation):
    """Keep the range (the default)."""

    def __init__(self, verbose=False):
        super().__init__(lambda step: False, verbose)


class _AbsMax(BinAdaptation):
    """Range ``[-m', m']``, ``m' = (1 + padding) · max(min_size / 2, m)`` for a maximum absolute value ``m``."""

    def __init__(self, track_schedule, verbose=False, padding=0.0, min_size=1e-6):
        """
        Args:
            track_schedule: callable ``step -> bool``: when to adapt.
            verbose: print the new limits.
            padding: relative padding added to ``m``.
            min_size: smallest width of the range.
        """
        super().__init__(track_schedule or schedules.linear(1), verbose)
        self._padding = float(padding)
        self._min_size = float(min_size)

    def limits(self, step, data, current):
        abs_max = float(self._abs_max(data))
        if not math.isfinite(abs_max):
            return tuple(current)
        end = (1.0 + self._padding) * max(self._min_size / 2, abs_max)
        if self._verbose:
            print(f"[cockpit-lite | step {step}] {type(self).__name__}: new limits {-end:.5f}, {end:.5f}")
        return (-end, end)

    def _abs_max(self, data):
        raise NotImplementedError


class GradAbsMax(_AbsMax):
    """Adapt to the largest absolute individual-gradient element, ``m = max_{n,d} |g̃_{n,d}|``."""

    TRANSFORMS = (IndividualGradAbsMax,)

    def _abs_max(self, data):
        return torch.stack(data.per_sample(IndividualGradAbsMax.key)).amax().item()


class ParamAbsMax(_AbsMax):
    """Adapt to the largest absolute parameter element, ``m = max_d |θ_d|``."""

    def _abs_max(self, data):
        return shards.abs_maxima(data.params).amax().item()  # (under FSDP2: over every rank's rows)
