"""Hessian-vector products through ``F.scaled_dot_product_attention`` on CPU.

PyTorch's CPU flash-attention kernel (the default of ``F.scaled_dot_product_attention``
on CPU, also inside ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``) has a
backward, ``aten::_scaled_dot_product_flash_attention_for_cpu_backward``, but no
derivative of that backward: a Hessian-vector product (double backward) fails with
``derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not
implemented``.

``enable_double_backward(register)`` registers that derivative (the ``AutogradCPU`` kernel of
the backward operator): the backward itself still runs the flash kernel on the user's
tensors, so forward values, gradients and hence the training trajectory are bit for bit
what they are without it (tested); only when the backward pass is recorded
(``create_graph=True``: the Cockpit's own gradient with graph on its due steps,
``cockpit_lite.curvature.hvp``) does its node get a derivative,
computed by differentiating the attention's *math* kernel
(``aten::_scaled_dot_product_attention_math``, plain matrix products and softmax) twice:
the same function, so the same Hessian. The user's kernel choice
(``torch.nn.attention.sdpa_kernel``, ``torch.backends.cuda.enable_*_sdp``) is never
changed. The registration is process-wide, done once, the first time a Cockpit
quantity needs Hessian-vector products (``cockpit_lite.curvature.derivatives``).
Attention with dropout (``dropout_p > 0``) never reaches the flash kernel on CPU: PyTorch
runs the math kernel, which records its mask and is twice differentiable already.
"""

import torch

OPERATOR = "_scaled_dot_product_flash_attention_for_cpu_backward"


class _FlashBackward(torch.autograd.Function):
    """The flash kernel's backward as a differentiable function of ``(δ, q, k, v)``."""

    @staticmethod
    def forward(ctx, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale):
        ctx.save_for_backward(grad_out, query, key, value)
        ctx.options = (dropout_p, is_causal, attn_mask, scale)
        with torch._C._AutoDispatchBelowAutograd():
            return _operator()(
                grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
            )

    @staticmethod
    def backward(ctx, *cotangents):
        _, is_causal, attn_mask, scale = ctx.options  # no dropout: PyTorch runs the math kernel for it
        inputs = [t.detach().requires_grad_() for t in ctx.saved_tensors]
        grad_out, query, key, value = inputs
        with torch.enable_grad():
            out = torch.ops.aten._scaled_dot_product_attention_math(
                query, key, value, attn_mask, 0.0, is_causal, scale=scale
            )[0]
            first = torch.autograd.grad(out, (query, key, value), grad_out, create_graph=True)
            cotangents = [torch.zeros_like(f) if c is None else c for c, f in zip(cotangents, first)]
            second = torch.autograd.grad(first, inputs, cotangents, allow_unused=True)
        return (*second, None, None, None, None, None, None)


def _operator():
    return getattr(torch.ops.aten, OPERATOR)


def _differentiable_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
    return _FlashBackward.apply(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale)


def enable_double_backward(register):
    """Register the derivative of the CPU flash-attention backward with ``register(operator, kernel,
    dispatch keys)`` (``cockpit_lite.curvature.derivatives``). Returns whether it is in place
    (``False`` on a PyTorch without the operator)."""
    if not hasattr(torch.ops.aten, OPERATOR):
        return False
    return register(OPERATOR, _differentiable_backward, ("AutogradCPU",))
