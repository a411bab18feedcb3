"""Euclidean norms of parameter-sized tensors, accurate whatever their size.

torch's float32 ``vector_norm`` and ``_foreach_norm`` on a CPU accumulate in a few long sums:
on 10⁶ elements they are off by up to 9·10⁻⁴ relative, on 1.3·10⁷ (one embedding of a
GPT-2-sized model) by 5·10⁻⁴ on random entries. ``norms`` takes tensors of at most ``CHUNK``
elements through one fused ``_foreach_norm``; larger ones up to ``EXACT`` elements through one
``vector_norm`` accumulated in float64 (exact to rounding); larger ones still row by row, rows
of ``CHUNK`` elements, the rows' norms combined in float64 (one ``vector_norm`` pass). The
fused and row-wise norms are off by at most 2.2·10⁻⁶ relative at any size (measured on
equal entries, the worst case of a float32 sum; about 10⁻⁷ on random ones). ``dot`` and
``gram`` sum dot products in float64.

Sharded tensors (``DTensor``, FSDP2's parameters and gradients; ``cockpit_lite.utils.shards``)
count with all their elements: each rank reduces its rows, and one all-reduce per call adds
the ranks' squares or products.
"""

import torch

from cockpit_lite.utils.shards import add_over_ranks, flat, group_of, is_sharded, local

CHUNK = 4096

EXACT = 1 << 17
"""``norms``: tensors of more than ``CHUNK`` and at most this many elements are reduced in float64
at once, cheaper there than row by row (one CPU thread: 48 µs against 87 µs at 50,176 elements,
97 against 108 at 131,072; above, float64 costs more: 159 against 129 at 262,144)."""

GATHER = 1 << 16
"""``gathered``: tensors of at most this many elements are concatenated into runs."""

PIECE = 1 << 18
"""``gram``: elements of each vector converted to float64 at a time (2 MiB)."""


def norms(tensors):
    """``‖t‖₂`` of every tensor (0-d tensors; in float32 for narrower floats, else in the
    tensor's dtype). NaN and Inf propagate."""
    tensors = list(tensors)
    group = group_of(tensors)
    if group is not None:
        return _sharded_norms(tensors, group)
    out = [None] * len(tensors)
    small = [i for i, t in enumerate(tensors) if t.numel() <= CHUNK]
    if small:
        wide = all(tensors[i].dtype in (torch.float32, torch.float64) for i in small)
        fused = torch._foreach_norm([tensors[i] for i in small], 2, dtype=None if wide else torch.float32)
        for i, value in zip(small, fused):
            out[i] = value
    for i, t in enumerate(tensors):
        if out[i] is None:
            out[i] = _exact(t) if t.numel() <= EXACT else _chunked(t)
    return out


def _sharded_norms(tensors, group):
    """``norms`` of a list with DTensors: the norms of the ranks' parts, their squares (float64)
    added over the ranks, one all-reduce."""
    parts = norms([local(t) for t in tensors])
    squares = torch.stack([part.double() for part in parts]).square()
    sharded = torch.tensor([is_sharded(t) for t in tensors], device=squares.device)
    squares = torch.where(sharded, add_over_ranks(torch.where(sharded, squares, 0.0), group), squares)
    return [root.to(part.dtype) for root, part in zip(squares.sqrt(), parts)]


def _dtype(tensor):
    """The dtype of ``tensor``'s norm: its own for float32 and float64, else float32."""
    return tensor.dtype if tensor.dtype in (torch.float32, torch.float64) else torch.float32


def _exact(tensor):
    return torch.linalg.vector_norm(tensor, dtype=torch.float64).to(_dtype(tensor))


def _chunked(tensor):
    dtype = _dtype(tensor)
    flat = tensor.reshape(-1)
    whole = flat.numel() // CHUNK * CHUNK
    rows = torch.linalg.vector_norm(flat[:whole].view(-1, CHUNK), dim=1, dtype=dtype).double()
    tail = torch.linalg.vector_norm(flat[whole:], dtype=dtype).double()
    return (rows.square().sum() + tail.square()).sqrt().to(dtype)


def dot(a, b=None):
    """``Σ_i a_iᵀ b_i`` over two iterables of tensors (pairs of equal size, taken as one vector
    each; ``b=None``: ``Σ_i ‖a_i‖²``, ``a`` read once, so it may make its tensors as it goes), a
    Python float, accurate at any size (``gram``; torch's float32 ``dot`` of 1.3·10⁷ elements
    is off by 5·10⁻⁴ relative on a CPU)."""
    g = gram((x,) for x in a) if b is None else gram(zip(a, b))
    return 0.0 if g is None else g[0][-1]


def gram(items):
    """``G[i][j] = Σ_t x_{t,i}ᵀ x_{t,j}`` over an iterable of tuples ``(x_{t,1}, …, x_{t,k})`` of
    tensors (each tuple's of equal size): the ``k × k`` Gram matrix of the vectors the tuples'
    i-th tensors make together, as nested Python floats (``None`` for no tuples). Products and
    sums in float64 (relative error about 10⁻¹⁵ at any size), ``PIECE`` elements of each vector
    converted at a time, small tensors gathered (``gathered``): one matrix product per piece,
    several products of the same vectors in one pass. Tuples of DTensors: each rank's rows,
    the ranks' products added by one all-reduce at the end."""
    total, shared, group = None, None, None
    for run in gathered(items):
        sharded = is_sharded(run[0])
        if sharded:
            group = group_of(run)
            run = tuple(flat(t) for t in run)
        for start in range(0, run[0].numel(), PIECE):
            rows = torch.stack([t[start : start + PIECE].to(torch.float64) for t in run])
            g = rows @ rows.T
            if sharded:
                shared = g if shared is None else shared + g.to(shared.device)
            else:
                total = g if total is None else total + g.to(total.device)  # (parameters on several devices)
        if sharded and shared is None:  # this rank holds none of the rows: its products are 0
            shared = torch.zeros((len(run), len(run)), dtype=torch.float64, device=run[0].device)
    if group is not None:
        shared = add_over_ranks(shared, group)
        total = shared if total is None else total + shared.to(total.device)
    return None if total is None else total.tolist()


def gathered(items, size=None):
    """Tuples of tensors (each tuple's of equal size), flattened, as fewer, larger tuples: runs
    of tuples of at most ``size`` (default ``GATHER``) elements concatenated position by
    position up to about ``size`` elements, larger ones alone, in order. One call per run
    instead of one per tensor (a model's many small biases and norms). Concatenation promotes
    mixed dtypes; tensors of one run share a device. A tuple of DTensors comes alone, as it
    is (its rows are spread over the ranks)."""
    size = GATHER if size is None else size
    run, count, device = [], 0, None
    for item in items:
        if is_sharded(item[0]):
            if run:
                yield tuple(torch.cat(ts) for ts in zip(*run))
                run, count = [], 0
            yield tuple(item)
            continue
        item = tuple(t.reshape(-1) for t in item)
        if run and (item[0].device != device or item[0].numel() > size):
            yield tuple(torch.cat(ts) for ts in zip(*run))
            run, count = [], 0
        if item[0].numel() > size:
            yield item
            continue
        run.append(item)
        count += item[0].numel()
        device = item[0].device
        if count >= size:
            yield tuple(torch.cat(ts) for ts in zip(*run))
            run, count = [], 0
    if run:
        yield tuple(torch.cat(ts) for ts in zip(*run))
