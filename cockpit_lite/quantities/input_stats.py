"""``InputStats``: statistics of the model's first input at each step.

A forward pre-hook on the model reads its first floating-point tensor argument ``x``
(positional, then keyword: ``model(x=...)``, Hugging Face's ``inputs_embeds=``; one with a batch
axis, not a 0-d count beside it: ``base.floating_inputs``) of the training forward pass
(gradients enabled; the first call of the step):
``mean``, ``std``, ``min``, ``max`` over all entries of its first ``SUB_BATCH`` samples
(along the first axis), and ``nonfinite``, the fraction of NaN/Inf entries among them
(the other statistics then skip them: NaN where no entry is finite, ``std`` NaN where one
is). ``std`` has Bessel's correction, ``√(Σ(x − mean)² / (n − 1))``, in float64 and in two passes
(``Σx² − n·mean²`` cancels: raw timestamps, mean 1.7e9 and std 1, gave 0). The hook reduces without
masking (the mean, then ``Σ(x − mean)²``, min and max); only where one of them is not finite, at
``compute``, are the non-finite entries masked out (element-wise operations, on CPU
5-20x dearer than the reductions). A sub-batch, for the same reason; a NaN in another
sample is still located by ``NonfiniteOrigin`` when it reaches the loss. Integer inputs
(token ids) are not floating-point and are not recorded. Reduced on the device, moved to
the host with the step's values.

Under torch.distributed (DDP, or a model sharded by FSDP2: ``cockpit_lite.sharded``) each rank sees its
part of the batch: it
keeps per sample of its first ``SUB_BATCH`` the finite entries' count, sum, sum of squared deviations
from their own mean, minimum and maximum (float64), and one all-gather at ``compute`` takes the global
batch's first ``SUB_BATCH`` samples from them in rank order (the samples' squared deviations combined
with their means' spread, Chan et al. 1979), as one process does.
"""

import torch

from cockpit_lite.distributed import gather_objects
from cockpit_lite.quantities.base import Needs, Output, Quantity, floating_inputs, input_module, user_forward
from cockpit_lite.utils.moments import pooled

KEYS = ("mean", "std", "min", "max", "nonfinite")
SUB_BATCH = 16
"""Samples the statistics are computed on."""


class InputStats(Quantity):
    """``{"mean", "std", "min", "max", "nonfinite"}`` of the model's first input."""

    TIER = 0  # (overhead budget: bookkeeping)

    NEEDS_BACKWARD = False
    STATE = ("_next",)  # the next step's number, which the forward pre-hook reads

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._handle = None
        self._module = None  # the module that receives the model's input (``watch``)
        self._stats = None
        self._next = 0
        self._group = None  # DDP, FSDP2: the ranks whose batches are one

    def bind(self, cockpit):
        self._group = cockpit.group  # (DDP or FSDP2: each rank sees its part of the batch)

    def watch(self, model):
        self._module = input_module(model)
        self._arm(True)

    def unbind(self):
        self._arm(False)
        self._module, self._stats = None, None

    def _arm(self, on):
        """Hook the model's input (``on``) or not: only a forward pass whose step is due is watched."""
        if on and self._handle is None and self._module is not None:
            self._handle = self._module.register_forward_pre_hook(self._pre, with_kwargs=True)
        elif not on and self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _pre(self, module, args, kwargs):
        if self._stats is not None or not user_forward() or not self.is_due(self._next):
            return None
        x = next(iter(floating_inputs(args, kwargs)), None)
        if x is None or x.numel() < (2 if self._group is None else 1):  # (ranks: the global batch's entries count)
            return None
        with torch.no_grad():
            self._stats = _sums(x.detach()) if self._group is None else _per_sample(x.detach())
        return None

    def needs(self, step, info):
        self._next = step + 1
        self._arm(self.is_due(self._next))
        if not self.is_due(step):
            self._stats = None
            return None
        return Needs()

    def compute(self, step, data):
        stats, self._stats = self._stats, None
        if self._group is not None:  # (every rank takes part, whatever it saw)
            ranks = gather_objects(stats, self._group.process_group)
            stats = None if all(r is None for r in ranks) else _combined([r for r in ranks if r is not None])
        elif stats is not None:
            stats = _statistics(*stats)
        if stats is None:
            return None
        return Output(dict(zip(KEYS, stats)))


def _sums(x):
    """``(tensor [mean, Σ(x − mean)², min, max] in float64, the entries)`` of the entries the statistics are of."""
    x = (x[:SUB_BATCH] if x.dim() > 1 else x).reshape(-1)
    wide = x.double()
    low, high = torch.aminmax(wide)
    mean = wide.mean()
    centred = wide - mean
    return torch.stack([mean, torch.dot(centred, centred), low, high]), x


def _statistics(sums, x):
    """``[mean, std, min, max, nonfinite]`` (float64) from ``_sums``: from the sums where they are all
    finite (then every entry is), else from the finite entries of ``x``."""
    if not bool(torch.isfinite(sums).all()):
        return _masked(x)
    mean, squares, low, high = sums
    std = (squares / (x.numel() - 1)).sqrt()
    return [mean, std, low, high, mean.new_zeros(())]


def _masked(x):
    """``_statistics`` of the finite entries of ``x`` (flat) and the share of the others, in float64."""
    x = x.double()
    finite = torch.isfinite(x)
    count = finite.sum()
    values = torch.where(finite, x, 0.0)
    mean = values.sum() / count
    squares = (torch.where(finite, x - mean, values) ** 2).sum()
    big = torch.finfo(x.dtype).max
    low = torch.where(finite, x, big).amin()
    high = torch.where(finite, x, -big).amax()
    return _of_finite(count, mean, squares, low, high) + [1.0 - count / finite.numel()]


def _of_finite(count, mean, squares, low, high):
    """``[mean, std, min, max]`` of ``count`` finite entries from their mean, sum of squared deviations, minimum
    and maximum: NaN without a finite entry (``min`` and ``max`` are then the sentinels of their reductions),
    ``std`` NaN with one."""
    none = mean.new_tensor(float("nan"))
    std = torch.where(count > 1, squares.clamp(min=0) / (count - 1), none).sqrt()
    return [mean, std] + [torch.where(count > 0, end, none) for end in (low, high)]


def _per_sample(x):
    """Several ranks: ``[samples, 7]`` (float64): per sample of the first ``SUB_BATCH`` (of a 1-d input, per
    entry), its entries, finite entries, their sum, sum of squared deviations from their mean, minimum
    and maximum, and whether the input has a batch axis."""
    batched = float(x.dim() > 1)
    x = (x[:SUB_BATCH].reshape(min(len(x), SUB_BATCH), -1) if x.dim() > 1 else x.reshape(-1, 1)).double()
    finite = torch.isfinite(x)
    count = finite.sum(1).double()
    sums = torch.where(finite, x, 0.0).sum(1)
    deviations = torch.where(finite, x - (sums / count)[:, None], 0.0)  # (a sample without a finite entry: 0)
    big = torch.finfo(x.dtype).max
    return torch.stack([
        torch.full((len(x),), float(x.shape[1]), dtype=x.dtype, device=x.device), count,
        sums, deviations.square().sum(1),
        torch.where(finite, x, big).amin(1),
        torch.where(finite, x, -big).amax(1),
        torch.full((len(x),), batched, dtype=x.dtype, device=x.device),
    ], 1)


def _combined(ranks):
    """``_statistics`` of the global batch's first ``SUB_BATCH`` samples from the ranks' ``_per_sample``; None
    where the global batch's input has fewer than 2 entries (as in one process)."""
    rows = torch.cat(ranks)
    if rows[:, 0].sum() < 2:
        return None
    rows = rows[:SUB_BATCH] if rows[0, 6] else rows  # (a 1-d input: every entry)
    entries, present = rows[:, :2].sum(0)
    mean, deviations = pooled(rows[:, 1], rows[:, 2], rows[:, 3])  # (the samples' finite entries)
    return _of_finite(present, mean, deviations, rows[:, 4].amin(), rows[:, 5].amax()) + [1 - present / entries]
