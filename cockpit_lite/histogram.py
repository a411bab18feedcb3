r"""Fixed-range 1-d and 2-d histograms computed on the tensor's device.

Binning rule
------------
With ``bins`` equal bins over ``range=(lo, hi)``, the value ``u = scale * v``
(``scale=None`` means 1) falls in

.. math::

    i(u) = \operatorname{clamp}\Big(\Big\lfloor (u - lo)\,\frac{bins}{hi - lo}\Big\rfloor,\;
           0,\; bins - 1\Big),

so bins are left-closed, ``[e_k, e_{k+1})`` with ``e_k = lo + k (hi - lo) / bins``,
except the last one, which is closed, ``[e_{bins-1}, hi]`` (``numpy.histogram``'s
rule). A value exactly on an interior edge ``e_k`` goes into bin ``k``.

* Out-of-range values are counted in the edge bins (the clamp, as Cockpit does);
  ``clipped`` counts the values strictly below ``lo`` or strictly above ``hi``. A
  2-d pair is clipped if either coordinate is.
* NaN and ±Inf are not counted; ``nonfinite`` counts them. A 2-d pair is
  non-finite if either coordinate is.

Precision. The index is computed on the device in float32 for float16, bfloat16
and float32 inputs and in float64 for float64 inputs (or when there are more
than about 4 million slots, see below), as

.. math::

    t = (v - p)\,g + r, \qquad g = scale \cdot \frac{bins}{hi - lo},
    \qquad r = (scale\,p - lo)\,\frac{bins}{hi - lo} - m,
    \qquad i = \lfloor t \rfloor + m,

with the pivot ``p = 0`` when ``0`` lies in the range (else the end of the range
nearest to 0, divided by ``scale``) and ``m`` the integer nearest to
``(scale p - lo) bins / (hi - lo)``. Subtracting the pivot and the integer ``m``
before rounding keeps small values exact: with ``p = 0`` the only rounding is
that of ``v g + r``, so a value of 1e-30 just below an edge at 0 still lands
left of it. The rule above therefore holds exactly whenever ``t`` is exactly
representable (dyadic ranges and bin widths, for example ``range=(-2, 2)`` with
32 bins and dyadic values). Otherwise a value within a few ulps of an edge may
land in the neighbouring bin (and a value within a few ulps of ``lo`` or ``hi``
may be counted as clipped or not on the other side). Finite values so large that
``t`` overflows the arithmetic dtype (about ``|v| g > 3e38`` in float32) are
counted as non-finite.

Algorithm
---------
Each value becomes an integer *code* that tells all the cases above apart, in a
few in-place elementwise operations on one buffer, with no comparison masks and
no host synchronisation:

.. math::

    K = \operatorname{clamp}\big(\lceil t \rceil - 3 \lfloor t \rfloor,\;
        2m - 2\,bins - 1,\; 2m + 2\big).

For a finite ``t`` with ``k = floor(t)`` (the value is in bin ``k + m``),
``K = -2k`` if ``t = k`` (on the edge) and ``K = -2k + 1`` otherwise, so the
value exactly at ``hi`` (``t = bins - m``) has a code of its own, the values just
above ``hi`` and those below ``lo`` have reserved codes, and the clamp folds the
far-out ones onto those. For ``t = ±Inf`` or NaN, ``ceil - 3 floor`` is NaN
(``Inf - Inf``) and stays NaN through the clamp. An axis thus has
``2 bins + 4`` *slots* ``s = 2m + 2 - K``: ``0`` below ``lo``; ``2j + 1`` and
``2j + 2`` bin ``j``; ``2 bins + 1`` and ``2 bins + 3`` above ``hi``;
``2 bins + 2`` exactly ``hi``. The flat slot of a pair is
``s_x (2 by + 4) + s_y`` (in 1-d, ``s``) and NaN becomes one extra *drop* slot. The flat
slot, an integer-valued float, becomes an integer by adding ``1.5 * 2**23``
(``1.5 * 2**52`` in float64) and subtracting the bit pattern of that constant
from the bits of the sum (much cheaper than a float-to-int cast). The slots are
counted, and the slot counts are folded into the bins, ``clipped`` and
``nonfinite`` on the device.

On the CPU the data are processed in blocks of ``_CPU_BLOCK`` elements per
intra-op thread, so that the temporaries stay in cache and no large buffer is
allocated (a fresh 40 MB buffer costs more in page faults than all the
arithmetic), and the slots are counted with ``torch.bincount``, the fastest in a
measurement on 1e7 skewed pairs on one thread (``index_add_`` and
``scatter_add_`` were 10-30% slower on the whole histogram, ``put_`` and
``index_put_(accumulate=True)`` slower still). On CUDA the blocks are large
(``_DEVICE_BLOCK``, only to bound the temporaries) and the slots are counted
with ``torch.histc`` on the integer slots (``bincount`` would read its maximum
back to the host). When the slots fit in shared memory (about 12k slots, e.g.
40 x 50 bins) its kernel keeps a histogram per thread block there, where atomics
on the few hot slots of skewed data are cheap, unlike the global-memory atomics
of ``scatter_add_`` or ``put_``. This choice has not been measured on a GPU yet.
Under ``torch.use_deterministic_algorithms(True)``, CUDA uses
``index_put_(accumulate=True)`` (sort-based) instead.
"""

import functools
import itertools
import math

import numpy as np
import torch

__all__ = ["edges", "histogram1d", "histogram1d_batch", "histogram2d"]

_CPU_BLOCK = 1 << 18  # elements per block and per intra-op thread
_DEVICE_BLOCK = 1 << 24

# Arithmetic dtype -> (magic constant, integer dtype of the same width, its bit pattern).
# For an integer-valued float n with |n| < 2**22 (2**51), n + magic has the bits
# magic_bits + n.
_MAGIC = {
    torch.float32: (1.5 * 2**23, torch.int32, 0x4B400000),
    torch.float64: (1.5 * 2**52, torch.int64, 0x4338000000000000),
}


def edges(bins, range):
    """Return the ``bins + 1`` edges ``numpy.linspace(lo, hi, bins + 1)`` (float64)."""
    lo, hi = range
    return np.linspace(lo, hi, bins + 1)


def histogram1d(values, bins, range, scale=None, out=None):
    """Histogram of ``scale * values`` with ``bins`` equal bins over ``range=(lo, hi)``.

    See the module docstring for the binning rule. Returns
    ``(counts, clipped, nonfinite)``: ``counts`` is an int64 tensor of shape
    ``[bins]`` on ``values.device`` (if ``out`` is given, the counts are added into
    ``out``, which is returned as ``counts``); ``clipped`` and ``nonfinite`` are 0-d
    int64 tensors on the same device.
    """
    return _histogram([values], [_axis(bins, range, scale)], out)


def histogram1d_batch(tensors, bins, range, scale=None):
    """One histogram per tensor, as :func:`histogram1d` gives them, computed in one pass.

    For many small tensors (the individual gradients of biases and small layers) this
    costs a few tensor operations in all instead of a few dozen per tensor: the
    tensors are concatenated, and each one's slots are offset by its position so
    that one count separates them. Returns ``(counts, clipped, nonfinite)`` with
    shapes ``[T, bins]``, ``[T]`` and ``[T]`` for ``T`` tensors (on the device of the
    first one); row ``i`` equals ``histogram1d(tensors[i], bins, range, scale)``.
    """
    axis = _axis(bins, range, scale)
    tensors = [torch.as_tensor(t).detach() for t in tensors]
    if not tensors:
        raise ValueError("histogram1d_batch needs at least one tensor")
    for t in tensors:
        if not t.is_floating_point():
            raise TypeError(f"expected a floating-point tensor, got {t.dtype}")
    device = tensors[0].device
    width = axis.slots + 1  # the slots of one tensor and its drop slot
    wide = any(t.dtype == torch.float64 for t in tensors) or len(tensors) * width >= 2**22
    dtype = torch.float64 if wide else torch.float32
    magic, int_dtype, magic_bits = _MAGIC[dtype]
    values = torch.cat([t.reshape(-1).to(dtype) for t in tensors])
    k = axis.codes(values, torch.empty_like(values), torch.empty_like(values))
    k.nan_to_num_(nan=axis.kmax - axis.slots)  # code of the drop slot
    base = torch.arange(len(tensors), dtype=dtype, device=device).mul_(width).add_(magic + axis.kmax)
    base = torch.cat([b.expand(t.numel()) for b, t in zip(base, tensors)])
    flat = torch.sub(base, k, out=k)
    index = flat.view(int_dtype).sub_(magic_bits)
    slots = torch.zeros(len(tensors) * width, dtype=torch.int64, device=device)
    _accumulator(device)(slots, index)
    total = axis.bins
    folded = slots.new_zeros(len(tensors), 2 * total + 1).index_add_(
        1, _fold_map((total,), device), slots.view(len(tensors), width)
    )
    clipped = folded[:, total : 2 * total]
    return folded[:, :total] + clipped, clipped.sum(1), folded[:, 2 * total]


def histogram2d(x, y, bins, range, scale=None, out=None):
    """2-d histogram of the pairs ``(scale * x, y)``.

    ``x`` and ``y`` must be broadcastable to a common shape; an operand smaller
    than that shape (typically ``y`` of shape ``[*S]`` shared by every row of ``x``
    of shape ``[B, *S]``) is binned once at its own shape and never expanded in
    memory. ``bins=(bx, by)``, ``range=((xlo, xhi), (ylo, yhi))``. ``counts`` has
    shape ``[bx, by]`` and ``counts[i, j]`` counts the pairs with ``x`` in x-bin
    ``i`` and ``y`` in y-bin ``j`` (the orientation of ``numpy.histogram2d(x, y)``).
    Returns ``(counts, clipped, nonfinite)`` as :func:`histogram1d` does.
    """
    bx, by = bins
    xrange, yrange = range
    return _histogram([x, y], [_axis(bx, xrange, scale), _axis(by, yrange, None)], out)


class _Axis:
    """Constants of one coordinate: ``t = (v - pivot) * slope + offset`` and its codes."""

    def __init__(self, bins, range, scale):
        lo, hi = (float(e) for e in range)
        if int(bins) != bins or bins < 1:
            raise ValueError(f"bins must be a positive integer, got {bins!r}")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"range must be finite with lo < hi, got {range!r}")
        scale = 1.0 if scale is None else float(scale)
        if not (math.isfinite(scale) and scale != 0.0):
            raise ValueError(f"scale must be finite and non-zero, got {scale!r}")
        self.bins = int(bins)
        self.slots = 2 * self.bins + 4
        density = self.bins / (hi - lo)
        self.slope = scale * density
        self.pivot = min(max(0.0, lo), hi) / scale
        position = (scale * self.pivot - lo) * density  # t of the pivot, in [0, bins]
        self.shift = round(position)  # m
        self.offset = position - self.shift  # r, |r| <= 1/2
        self.kmin = 2 * self.shift - 2 * self.bins - 1
        self.kmax = 2 * self.shift + 2

        self._constants = {}

    def codes(self, values, out, scratch):
        """Write the clamped codes ``K`` of ``values`` (NaN if non-finite) into ``out``."""
        pivot, offset = self.constants(out.dtype, out.device)
        if pivot is not None:
            torch.sub(values, pivot, out=out)
            values = out
        torch.add(offset, values, alpha=self.slope, out=out)
        torch.floor(out, out=scratch)
        return out.ceil_().sub_(scratch, alpha=3).clamp_(self.kmin, self.kmax)

    def constants(self, dtype, device):
        """``(pivot, offset)`` as one-element tensors (they take part in type promotion,
        unlike Python scalars); ``pivot`` is ``None`` when it is 0."""
        key = (dtype, device)
        if key not in self._constants:
            pivot = None if self.pivot == 0.0 else _constant(self.pivot, dtype, device)
            self._constants[key] = (pivot, _constant(self.offset, dtype, device))
        return self._constants[key]


def _axis(bins, range, scale):
    """The ``_Axis`` of ``bins`` over ``range`` with ``scale``, cached for hashable arguments."""
    try:
        return _cached_axis(bins, tuple(range), scale)
    except TypeError:  # unhashable: build it (and let it check the arguments)
        return _Axis(bins, range, scale)


_cached_axis = functools.lru_cache(maxsize=64)(lambda bins, range, scale: _Axis(bins, range, scale))


@functools.lru_cache(maxsize=8)
def _fold_map(bins, device):
    """Flat slot -> position in ``[counts (as if clipped=False) | counts of clipped | nonfinite]``.

    Slot ``s`` of an axis with ``n`` bins is in bin ``clamp((s - 1) // 2, 0, n - 1)``
    and in range for ``1 <= s <= 2n`` and ``s = 2n + 2``; a flat slot is clipped if
    any of its axes is out of range. The drop slot maps to the last position.
    """
    flat_bin = torch.zeros((), dtype=torch.int64, device=device)
    clipped = torch.zeros((), dtype=torch.bool, device=device)
    for n in bins:
        slot = torch.arange(2 * n + 4, device=device)
        to_bin = torch.div(slot - 1, 2, rounding_mode="floor").clamp_(0, n - 1)
        outside = (slot == 0) | (slot == 2 * n + 1) | (slot == 2 * n + 3)
        flat_bin = (flat_bin.unsqueeze(-1) * n + to_bin).reshape(-1)
        clipped = (clipped.unsqueeze(-1) | outside).reshape(-1)
    total = math.prod(bins)
    drop = torch.full((1,), 2 * total, dtype=torch.int64, device=device)
    return torch.cat([flat_bin + total * clipped, drop])


def _constant(value, dtype, device):
    """A one-element tensor: it takes part in type promotion, unlike a Python scalar."""
    return torch.full((1,), value, dtype=dtype, device=device)


def _histogram(coords, axes, out):
    """Shared body of ``histogram1d`` / ``histogram2d`` (see the module docstring)."""
    coords = [torch.as_tensor(c).detach() for c in coords]
    for c in coords:
        if not c.is_floating_point():
            raise TypeError(f"expected a floating-point tensor, got {c.dtype}")
    device = coords[0].device
    shape = _broadcast_shape([c.shape for c in coords]) or (1,)
    coords = [c.reshape(1) if c.dim() == 0 else c for c in coords]
    numel = math.prod(shape)

    # Row-major weights of the slot axes; the last slot is the drop slot.
    weights = [math.prod(a.slots for a in axes[d + 1:]) for d in range(len(axes))]
    drop = math.prod(a.slots for a in axes)
    exact32 = drop + sum(a.slots for a in axes) < 2**22
    wide = any(c.dtype == torch.float64 for c in coords) or not exact32
    dtype = torch.float64 if wide else torch.float32
    magic, int_dtype, magic_bits = _MAGIC[dtype]

    # flat slot + magic = base - sum_d weights[d] * K_d. Operands smaller than
    # `shape` are folded into `base` once, at their own shape.
    base = _constant(magic + sum(w * a.kmax for w, a in zip(weights, axes)), dtype, device)
    full = [d for d, c in enumerate(coords) if c.numel() == numel]
    if not full:
        full = [max(range(len(coords)), key=lambda d: coords[d].numel())]
    folded = len(full) < len(coords)
    for d, c in enumerate(coords):
        if d not in full:
            k = axes[d].codes(c, torch.empty(c.shape, dtype=dtype, device=device),
                              torch.empty(c.shape, dtype=dtype, device=device))
            base = torch.add(base, k, alpha=-weights[d])
    if folded:
        base = base.expand(shape)
    if len(coords) > 1:
        coords = [coords[d].expand(shape) for d in full]

    if device.type == "cpu":
        block = _CPU_BLOCK * torch.get_num_threads()
    else:
        block = _DEVICE_BLOCK
    size = min(block, numel)
    buffers = [torch.empty(size, dtype=dtype, device=device) for _ in range(len(full) + 1)]
    scratch = buffers.pop()
    slots = torch.zeros(drop + 1, dtype=torch.int64, device=device)
    accumulate = _accumulator(device)
    for index in _blocks(shape, block) if numel else ():
        flat = None
        for d, values, buffer in zip(full, coords, buffers):
            if index:
                values = values[index]
            n = values.numel()
            k = axes[d].codes(values, buffer[:n].view(values.shape), scratch[:n].view(values.shape))
            if flat is None:  # a one-element base broadcasts
                flat = torch.sub(base[index] if folded else base, k, alpha=weights[d], out=k)
            else:
                flat.sub_(k, alpha=weights[d])
        flat.nan_to_num_(nan=magic + drop)
        accumulate(slots, flat.view(int_dtype).sub_(magic_bits).view(-1))

    bins = tuple(a.bins for a in axes)
    total = math.prod(bins)
    folded = slots.new_zeros(2 * total + 1).index_add_(0, _fold_map(bins, device), slots)
    counts = (folded[:total] + folded[total:2 * total]).view(bins)
    clipped = folded[total:2 * total].sum()
    nonfinite = folded[2 * total]
    if out is not None:
        counts = out.add_(counts)
    return counts, clipped, nonfinite


def _broadcast_shape(shapes):
    """``torch.broadcast_shapes`` without its Python overhead (this runs once per layer)."""
    ndim = max(len(s) for s in shapes)
    out = []
    for sizes in zip(*((1,) * (ndim - len(s)) + tuple(s) for s in shapes)):
        sizes = set(sizes) - {1}
        if len(sizes) > 1:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} are not broadcastable")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _blocks(shape, size):
    """Index tuples cutting ``shape`` into row-major blocks of at most ``size`` elements.

    Leading dimensions are iterated one index at a time and the first dimension
    whose trailing block exceeds ``size`` is sliced, so every block is a view of
    an (expanded) tensor of that shape.
    """
    inner, split = 1, len(shape)
    while split > 0 and inner * shape[split - 1] <= size:
        split -= 1
        inner *= shape[split]
    if split == 0:
        yield ()
        return
    step = max(1, size // inner)
    length = shape[split - 1]
    for outer in itertools.product(*(range(n) for n in shape[:split - 1])):
        for start in range(0, length, step):
            yield outer + (slice(start, start + step),)


def _accumulator(device):
    """``accumulate(slots, index)``: add 1 to ``slots[index[i]]`` for every ``i``."""
    if device.type != "cuda":
        return _accumulate_bincount
    if torch.are_deterministic_algorithms_enabled():
        return _accumulate_index_put
    return _accumulate_histc


def _accumulate_bincount(slots, index):
    slots.add_(torch.bincount(index, minlength=slots.numel()))


def _accumulate_index_put(slots, index):
    ones = torch.ones(1, dtype=torch.int64, device=index.device).expand(index.numel())
    slots.index_put_((index.long(),), ones, accumulate=True)


def _accumulate_histc(slots, index):
    # Integer input: the bin is computed exactly; the kernel privatises the
    # histogram per thread block in shared memory when it fits.
    n = slots.numel()
    slots.add_(torch.histc(index, bins=n, min=0, max=n))
