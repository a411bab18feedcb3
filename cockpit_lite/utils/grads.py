"""The gradient a parameter holds, as the Cockpit reads it."""

import torch


def held(param, copy=False):
    """``param.grad`` detached (a copy with ``copy``), or ``None``; a sparse gradient
    (``nn.Embedding(sparse=True)``, ``nn.EmbeddingBag(sparse=True)``) as its dense tensor, the
    parameter's size, formed only where the Cockpit reads it (every statistic is of the dense
    gradient; the optimizer keeps the sparse one)."""
    grad = param.grad
    if grad is None:
        return None
    grad = grad.detach()
    if grad.layout != torch.strided:
        return dense(grad)  # (a new tensor: a copy already)
    return grad.clone() if copy else grad


def dense(tensor):
    """A sparse tensor (a sparse-gradient module's gradient from autograd) as its dense form; any other as it is."""
    return tensor.to_dense() if tensor.layout != torch.strided else tensor
