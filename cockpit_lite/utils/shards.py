"""Tensors sharded across ranks (``torch.distributed.tensor.DTensor``, FSDP2's parameters).

Under FSDP2 (``fully_shard``) a parameter, its gradient and every quantity's tensor of the
parameter's shape (a copy ``θ₀``, ``Σ_n g̃_n²``) are DTensors: each rank holds its rows
along the first axis (``Shard(0)``). Elementwise arithmetic between them stays on each rank; a
sum over elements is each rank's partial sum, added over the ranks. These helpers do that for
the reductions the quantities use (``cockpit_lite.utils.norms``): the local part, then one
all-reduce of all the partial sums of a call. Nothing here imports ``torch.distributed.tensor``:
a tensor can only be a ``DTensor`` once that module is loaded.
"""

import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist

_gathered = []  # the scopes of ``gathering``: {key: whole tensor}


def is_sharded(tensor):
    """Whether ``tensor`` is a ``DTensor`` (its elements spread over the ranks)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local(tensor):
    """This rank's part of a ``DTensor`` (a plain tensor); any other tensor as it is."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def whole(tensor, key=None):
    """The whole tensor on every rank (``DTensor.full_tensor()``: one all-gather); a plain tensor as it is.

    Inside ``gathering()``, a ``DTensor`` is gathered once per ``key`` (default: the object) and
    the same whole tensor returned after that: a transform that runs once per chunk of samples
    (their number differs between the ranks) gathers on its first chunk only, so that every rank
    makes the same collectives."""
    if not is_sharded(tensor):
        return tensor
    if not _gathered:
        return tensor.full_tensor()
    scope = _gathered[-1]
    if key is None:  # by the object, which the scope keeps meanwhile (its id stays its own)
        key = id(tensor)
        scope.setdefault(("object", key), tensor)
    if key not in scope:
        scope[key] = tensor.full_tensor()
    return scope[key]


def whole_of(key, make):
    """``whole(make(), key)``, with ``make`` called only where the scope of ``gathering`` has not gathered
    ``key`` yet (a direction formed anew on every read is formed once per scope)."""
    if _gathered and key in _gathered[-1]:
        return _gathered[-1][key]
    return whole(make(), key)


@contextmanager
def gathering():
    """A scope in which ``whole`` gathers each tensor (or key) once; what it gathered is dropped at its end."""
    _gathered.append({})
    try:
        yield
    finally:
        _gathered.pop()


def rows_like(tensor, like, dim=0):
    """This rank's part of ``tensor`` in the layout of ``like`` (a tensor of ``tensor``'s shape along
    ``dim`` and after): a ``DTensor``'s local rows; a whole tensor's rows that a ``DTensor`` ``like``
    holds on this rank (sharded along its first axis, as FSDP2 shards); else ``tensor`` itself."""
    if is_sharded(tensor):
        return tensor.to_local()
    if not is_sharded(like):
        return tensor
    first, mesh = like.shape[0], like.device_mesh
    start = min(mesh.get_local_rank() * -(-first // mesh.size()), first)
    return tensor.narrow(dim, start, like.to_local().shape[0])


def shaped_like(rows, like):
    """``rows`` (this rank's part, ``rows_like``) as a tensor of ``like``'s layout: a ``DTensor``
    sharded as ``like``, or ``rows`` itself."""
    if not is_sharded(like):
        return rows
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(rows, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                              stride=like.stride())


def group_of(tensors):
    """The process group of the first ``DTensor`` among ``tensors``, ``None`` if there is none."""
    for tensor in tensors:
        if is_sharded(tensor):
            return tensor.device_mesh.get_group()
    return None


def add_over_ranks(partial, group):
    """``partial`` (a plain tensor of this rank's partial sums) summed over the ranks of ``group``,
    in float64, in its own dtype and device afterwards."""
    summed = partial.detach().to(torch.float64)
    if summed.device.type == "cpu" and dist.get_backend(group) == "nccl":
        summed = summed.cuda()
    dist.all_reduce(summed, group=group)
    return summed.to(partial.device, partial.dtype)


def flat(tensor):
    """``tensor.reshape(-1)`` of this rank's part: a ``DTensor``'s local rows (their sums over
    elements are partial sums, to be added over the ranks)."""
    return local(tensor).reshape(-1)


def totals(tensors):
    """``Σ_d t_d`` of every tensor, one tensor ``[P]`` (the dtype of the first; ``torch.stack`` of
    the sums): a ``DTensor``'s over all ranks' elements (one all-reduce for all of them)."""
    tensors = list(tensors)
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is None or not any(isinstance(t, dtensor) for t in tensors):  # (plain tensors: their sums)
        return torch.stack([t.sum() for t in tensors])
    group = group_of(tensors)
    sums = torch.stack([local(t).sum() for t in tensors])
    if group is None:
        return sums
    sharded = torch.tensor([is_sharded(t) for t in tensors], device=sums.device)
    return torch.where(sharded, add_over_ranks(torch.where(sharded, sums, 0), group), sums)


def abs_maxima(tensors):
    """``max_d |t_d|`` of every tensor, one tensor ``[P]`` (NaN if an element is NaN; 0 for a tensor without
    elements): a ``DTensor``'s over all ranks' elements (one all-gather of the ranks' maxima, since a
    rank may hold no rows of it)."""
    tensors = list(tensors)
    parts = [local(t).detach().abs() for t in tensors]
    maxima = torch.stack([p.amax() if p.numel() else p.new_zeros(()) for p in parts])
    group = group_of(tensors)
    if group is None:
        return maxima
    every = [torch.empty_like(maxima) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, maxima, group=group)
    return torch.stack(every).amax(0)


def module_class(module):
    """``module``'s class; for a module ``fully_shard``-ed by FSDP2, the class it had before
    (FSDP2 gives it a class ``FSDP<Class>`` of its own)."""
    kind = type(module)
    index = getattr(kind, "_orig_cls_mro_index", None)
    if index is not None and kind.__name__.startswith("FSDP"):
        return kind.__mro__[index]
    return kind
