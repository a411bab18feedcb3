"""Normalisation layers: elementwise affine maps of a normalised input ``x̂``.

For ``y = γ ⊙ x̂ + β`` (``γ``, ``β`` broadcast over the non-parameter axes), sample n's
gradients are ``Σ δ_n ⊙ x̂_n`` and ``Σ δ_n`` over every axis of sample n that the
parameter is broadcast along. ``x̂`` is recomputed from the recorded input with the
statistics the layer used: per sample (LayerNorm, RMSNorm), of the batch (BatchNorm in
training mode) or the running ones (BatchNorm in eval mode), by torch's own normalisation
kernel without the affine parameters (one fused pass, the forward's arithmetic). GroupNorm
forms the sums by torch's GroupNorm backward kernel without ``x̂`` (``GroupNormRule``).
"""

import torch
from torch.nn import functional as F

from cockpit_lite.engine.rules.base import Rule, UnsupportedCall, batch_axis, compute_dtype, output_grad
from cockpit_lite.engine.per_sample import PerSample


class _AffineNorm(Rule):
    """``normalised(module, x, dtype)``: ``x̂`` of ``x`` (in the rule's dtype) as the layer normalised its
    input of dtype ``dtype``."""

    def check(self, call, batch_size):
        inputs = call.args[0] if call.args else None
        if not torch.is_tensor(inputs):
            raise UnsupportedCall("called without a positional input")
        self.axis(call.module, inputs, batch_size)

    def per_sample(self, call, tracked, batch_size):
        inputs, delta = call.args[0], output_grad(call)
        dtype = compute_dtype(inputs, delta, tracked[0][1])
        x = inputs.detach().to(dtype)
        axis = self.axis(call.module, x, batch_size)
        x_hat = self.normalised(call.module, x, inputs.dtype).movedim(axis, 0)
        d = delta.detach().to(dtype).movedim(axis, 0)
        out = {}
        for name, param, index in tracked:
            part = x_hat.mul_(d) if name == "weight" else d  # (x̂ is this rule's own: no second temporary)
            out[name] = PerSample(param, index, grad_batch=self.reduce(part, param))
        return out


class _TrailingNorm(_AffineNorm):
    """Parameters over the trailing ``normalized_shape`` axes; the batch axis is before them."""

    def axis(self, module, x, batch_size):
        trailing = len(module.normalized_shape)
        return batch_axis(x[(...,) + (0,) * trailing], batch_size)

    def reduce(self, part, param):
        return part.reshape(part.shape[0], -1, *param.shape).sum(1)


class LayerNormRule(_TrailingNorm):
    """LayerNorm: ``x̂ = (x − mean) / sqrt(var + ε)`` over the last ``normalized_shape`` axes."""

    def normalised(self, module, x, dtype):
        return F.layer_norm(x, module.normalized_shape, eps=module.eps)


class RMSNormRule(_TrailingNorm):
    """RMSNorm: ``x̂ = x / sqrt(mean(x²) + ε)`` over the last ``normalized_shape`` axes; ``ε`` by default
    (``eps=None``) the machine epsilon of the dtype the layer computes in, its input's (float32 for a
    bf16 or fp16 input), not the wider dtype the rule may compute in (a float64 layer on float32 inputs)."""

    def normalised(self, module, x, dtype):
        eps = torch.finfo(torch.promote_types(dtype, torch.float32)).eps if module.eps is None else module.eps
        return F.rms_norm(x, module.normalized_shape, eps=eps)


class _ChannelNorm(_AffineNorm):
    """Parameters over the channel axis 1 of ``[B, C, ...]`` inputs."""

    def axis(self, module, x, batch_size):
        if x.dim() < 2 or x.shape[0] != batch_size:
            raise UnsupportedCall(f"{type(module).__name__} input without a leading batch axis of size {batch_size}")
        return 0

    def reduce(self, part, param):
        return part.reshape(part.shape[0], part.shape[1], -1).sum(2)


class GroupNormRule(_ChannelNorm):
    """GroupNorm: ``x̂`` normalised per sample over each group of channels and all positions.

    Without forming ``x̂``: torch's own GroupNorm backward kernel, given the batch as one
    sample of ``B·C`` channels in ``B·G`` groups (the same groups: a group's channels are
    consecutive within a sample), returns as the affine parameters' gradients
    ``Σ_s δ_{n,c,s} x̂_{n,c,s} = rstd_{n,g} (Σ_s δ_{n,c,s} x_{n,c,s} − mean_{n,g} Σ_s δ_{n,c,s})``
    and ``Σ_s δ_{n,c,s}`` for every sample and channel: one pass over ``δ`` and ``x``, with
    the rounding of the layer's own weight gradient, which autograd forms by the same kernel
    (measured on the CPU, ``[64, 16, 32, 32]``: 0.65 ms instead of 0.94 ms). ``mean`` and
    ``rstd`` come from torch's GroupNorm forward kernel, as in the layer's forward pass."""

    def per_sample(self, call, tracked, batch_size):
        module, inputs, delta = call.module, call.args[0], output_grad(call)
        self.axis(module, inputs, batch_size)
        dtype = compute_dtype(inputs, delta, tracked[0][1])
        x, d = inputs.detach().to(dtype), delta.detach().to(dtype)
        b, c, groups = x.shape[0], x.shape[1], module.num_groups
        positions = x[0, 0].numel()
        _, mean, rstd = torch.native_group_norm(x, None, None, b, c, positions, groups, module.eps)
        names = [name for name, _, _ in tracked]
        _, weight, bias = torch.ops.aten.native_group_norm_backward(
            d.reshape(1, b * c, positions), x.reshape(1, b * c, positions), mean.reshape(1, -1),
            rstd.reshape(1, -1), x.new_ones(b * c), 1, b * c, positions, b * groups,
            [False, "weight" in names, "bias" in names])
        sums = {"weight": weight, "bias": bias}
        return {name: PerSample(param, index, grad_batch=sums[name].reshape(b, c)) for name, param, index in tracked}


class BatchNormRule(_ChannelNorm):
    """BatchNorm: ``x̂`` normalised per channel with the batch statistics (training mode, or
    no running statistics) or the running ones (eval mode)."""

    def normalised(self, module, x, dtype):
        if module.training or not module.track_running_stats:  # the batch's statistics, running ones untouched
            return F.batch_norm(x, None, None, training=True, eps=module.eps)
        return F.batch_norm(x, module.running_mean.to(x.dtype), module.running_var.to(x.dtype), eps=module.eps)
