"""Euclidean norms of parameter-sized tensors, accurate whatever their size.

torch's float32 ``vector_norm`` and ``_foreach_norm`` on a CPU accumulate one long sum: on
10⁶ elements they are off by about 10⁻⁵ relative, on 1.3·10⁷ (one embedding of a
GPT-2-sized model) by 5·10⁻⁴. ``norms`` takes the norm of each row of ``CHUNK`` elements
(accurate) and combines the rows' squares in float64: relative error about 10⁻⁹ at any
size, at the cost of one ``vector_norm`` pass. Tensors of at most ``CHUNK`` elements go
through one fused ``_foreach_norm``. ``dot`` sums dot products the same way.
"""

import torch

CHUNK = 4096


def norms(tensors):
    """``‖t‖₂`` of every tensor (0-d tensors; in float32 for narrower floats, else in the
    tensor's dtype). NaN and Inf propagate."""
    tensors = list(tensors)
    out = [None] * len(tensors)
    small = [i for i, t in enumerate(tensors) if t.numel() <= CHUNK]
    if small:
        wide = all(tensors[i].dtype in (torch.float32, torch.float64) for i in small)
        fused = torch._foreach_norm([tensors[i] for i in small], 2, dtype=None if wide else torch.float32)
        for i, value in zip(small, fused):
            out[i] = value
    for i, t in enumerate(tensors):
        if out[i] is None:
            out[i] = _chunked(t)
    return out


def _chunked(tensor):
    dtype = tensor.dtype if tensor.dtype in (torch.float32, torch.float64) else torch.float32
    flat = tensor.reshape(-1)
    whole = flat.numel() // CHUNK * CHUNK
    rows = torch.linalg.vector_norm(flat[:whole].view(-1, CHUNK), dim=1, dtype=dtype).double()
    tail = torch.linalg.vector_norm(flat[whole:], dtype=dtype).double()
    return (rows.square().sum() + tail.square()).sqrt().to(dtype)


def dot(a, b=None):
    """``Σ_i a_iᵀ b_i`` over two iterables of tensors (pairs of equal size, taken as one vector
    each; ``b=None``: ``Σ_i ‖a_i‖²``, ``a`` read once, so it may make its tensors as it goes), a
    Python float: each ``CHUNK``-element row's dot product in float32 or wider, the rows
    summed in float64 (relative error 10⁻⁷ or less at any size, about 10⁻⁹ over many rows; torch's
    float32 ``dot`` of 1.3·10⁷ elements is off by 5·10⁻⁴). One tensor at a time, with no temporary
    of a tensor's size."""
    total = 0.0
    for x, y in ((x, x) for x in a) if b is None else zip(a, b):
        x, y = x.reshape(-1), y.reshape(-1)
        if x.numel() <= CHUNK:  # exact products, one call
            total += float(torch.dot(x.double(), y.double()))
            continue
        dtype = torch.promote_types(torch.promote_types(x.dtype, y.dtype), torch.float32)
        x, y = x.to(dtype), y.to(dtype)
        whole = x.numel() // CHUNK * CHUNK
        rows = torch.linalg.vecdot(x[:whole].view(-1, CHUNK), y[:whole].view(-1, CHUNK))
        total += float(rows.sum(dtype=torch.float64) + (x[whole:] * y[whole:]).sum(dtype=torch.float64))
    return total
