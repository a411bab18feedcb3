"""Shared pieces of the individual-gradient rules."""

import warnings
from contextlib import contextmanager

import torch


class UnsupportedCall(Exception):
    """This rule cannot form the individual gradients of this call (the engine falls back)."""


class Rule:
    """Base of the rules: ``per_sample(call, tracked, B) -> {name: PerSample}``.

    ``in_backward``: computed inside the backward pass (as soon as the call's output
    gradient arrives) rather than after it. ``check(call, B)`` raises
    ``UnsupportedCall`` before the backward pass for a call the rule cannot serve, so
    that the engine can send its parameters to the global path in time.
    """

    in_backward = True
    parameters = ("weight", "bias")
    """The names of the module's own parameters the rule forms individual gradients of (``None``: any).
    Another parameter of such a module (the old ``torch.nn.utils.weight_norm``'s ``weight_g`` and
    ``weight_v``, from which a forward pre-hook computes ``weight``) is not the layer's: the engine
    serves it by the path of a shared tensor where there is one, else by the global path."""

    def check(self, call, batch_size):
        pass

    def per_sample(self, call, tracked, batch_size):
        raise NotImplementedError

    def per_sample_of(self, call, tracked, batch_size, rows):
        """``per_sample`` of the samples ``rows`` only (a subsample, ``cockpit_lite.subsample``):
        ``PerSample`` objects of ``len(rows)`` samples whose ``grad`` is the gradient of all
        ``batch_size``. By default all samples' individual gradients, then selected; a rule
        whose cost grows with the samples it forms computes the subsample's alone."""
        return {name: part.select(rows) for name, part in self.per_sample(call, tracked, batch_size).items()}


def compute_dtype(*tensors):
    """At least float32 (statistics of bf16/fp16 models and autocast are accumulated in float32)."""
    dtype = torch.float32
    for t in tensors:
        if t is not None and t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def batch_axis(tensor, batch_size, preferred=None, exclude_last=False):
    """The axis of ``tensor`` that indexes the samples: ``preferred`` if given, else the
    first axis of size ``batch_size`` (the last axis is skipped with ``exclude_last``).

    Raises:
        UnsupportedCall: if there is no such axis.
    """
    dims = tensor.dim() - (1 if exclude_last else 0)
    if preferred is not None:
        if preferred < dims and tensor.shape[preferred] == batch_size:
            return preferred
        raise UnsupportedCall(f"axis {preferred} of a tensor of shape {tuple(tensor.shape)} is not of batch size {batch_size}")
    for axis in range(dims):
        if tensor.shape[axis] == batch_size:
            return axis
    raise UnsupportedCall(f"no axis of size {batch_size} (the batch) in a tensor of shape {tuple(tensor.shape)}")


def samples_first(tensor, batch_size, axis=None, exclude_last=False, dtype=None):
    """``tensor`` with its batch axis moved to the front, detached, in ``dtype``."""
    axis = batch_axis(tensor, batch_size, axis, exclude_last)
    moved = tensor.detach().movedim(axis, 0)
    return moved if dtype is None else moved.to(dtype)


def first_tensor(values):
    """The first tensor among ``values`` (positional arguments), or ``None``."""
    for value in values:
        if torch.is_tensor(value):
            return value
    return None


def output_grad(call, position=0):
    """``δ`` of output tensor ``position`` of ``call`` (zeros if the loss did not use it)."""
    grad = call.grads.get(position)
    if grad is None:
        return call.leaves[position].zeros()
    return grad


_RERUNS = [0]


@contextmanager
def rerun():
    """Mark the engine's re-run of a module (``torch.func``, to form its individual gradients):
    forward hooks of the model (the diagnosis' signals) must not take it for the user's forward
    pass (``rerunning``)."""
    _RERUNS[0] += 1
    try:
        yield
    finally:
        _RERUNS[0] -= 1


@contextmanager
def quiet_batching_fallback():
    """Inside the block only, silence torch.func's "There is a performance drop because we have not yet
    implemented the batching rule for aten::OP" warnings: they come from the engine's own ``vmap`` over
    the samples (an operation vmap runs in a loop: an LSTM's mkldnn kernel, ``nn.Bilinear``,
    ``nn.EmbeddingBag``), are about the engine's implementation, and ask the user to file an issue
    with PyTorch. The user's own warnings pass as they are."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")
        yield


def rerunning():
    """Whether a module call happens inside the engine's re-run (``rerun``)."""
    return _RERUNS[0] > 0
