"""Embedding: individual gradients as the looked-up rows of each sample."""

import torch

from cockpit_lite.engine.rules.base import Rule, UnsupportedCall, batch_axis, compute_dtype, output_grad
from cockpit_lite.engine.per_sample import PerSample


class EmbeddingRule(Rule):
    """``y = W[idx]``: sample n's weight gradient has row ``v`` equal to the sum of ``δ`` over
    the positions of sample n that looked up ``v`` (zero for ``padding_idx``).

    Kept as rows (``PerSample`` rows form): one per distinct (sample, index) pair, so a
    ``[B, V, D]`` tensor is never built for a large vocabulary. ``sparse=True`` changes only the
    layout of the gradient autograd leaves (the Cockpit reads it dense, ``utils.grads``), not
    these rows.
    """

    parameters = ("weight",)

    def check(self, call, batch_size):
        if call.module.scale_grad_by_freq:
            raise UnsupportedCall("Embedding with scale_grad_by_freq")
        batch_axis(call.args[0], batch_size)

    def per_sample(self, call, tracked, batch_size):
        module = call.module
        if module.scale_grad_by_freq:
            raise UnsupportedCall("Embedding with scale_grad_by_freq")
        indices, delta = call.args[0], output_grad(call)
        dtype = compute_dtype(delta, module.weight)
        axis = batch_axis(indices, batch_size)
        idx = indices.detach().movedim(axis, 0).reshape(batch_size, -1)
        d = delta.detach().movedim(axis, 0).to(dtype).reshape(batch_size, -1, delta.shape[-1])
        vocabulary = module.weight.shape[0]
        keys = (torch.arange(batch_size, device=idx.device)[:, None] * vocabulary + idx).reshape(-1)
        d = d.reshape(-1, d.shape[-1])
        if module.padding_idx is not None:
            keep = idx.reshape(-1) != module.padding_idx
            keys, d = keys[keep], d[keep]
        unique, inverse = torch.unique(keys, return_inverse=True)  # sorted: the samples ascending
        values = d.new_zeros((unique.numel(), d.shape[-1])).index_add_(0, inverse, d)
        (_, param, index), = tracked
        rows = (values, unique // vocabulary, unique % vocabulary, batch_size)
        return {"weight": PerSample(param, index, rows=rows)}

