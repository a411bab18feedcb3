"""Hessian-vector products through ``weight_norm``, whose second derivative PyTorch gets wrong.

``torch.nn.utils.parametrizations.weight_norm`` (and the older ``torch.nn.utils.weight_norm``)
compute ``w = g · v / ‖v‖`` (the norm over every axis but ``dim``) with ``torch._weight_norm``,
which runs the fused ``aten::_weight_norm_interface`` where it can (torch 2.13 on CPU:
``dim = 0``, the default). Its backward is right; but when the backward pass is recorded
(``create_graph=True``), PyTorch forms the gradient with
``aten::_weight_norm_differentiable_backward``, which takes the norms saved by the forward
pass for constants, so every second derivative through ``v`` is wrong:
``torch.autograd.gradgradcheck`` fails, and the Hessian of a weight-normalised layer is not
even symmetric (its ``∂²/∂v²`` and ``∂²/∂g∂v`` blocks 15 and 11 away from those of the same
function written out, on a Linear(4, 3)). No error is raised: ``HessMaxEV``, Hutchinson's
trace and any Hessian-vector product would be silently wrong (their autograd brute force
too).

``enable_double_backward(register)`` registers another implementation of
``_weight_norm_differentiable_backward`` (its ``AutogradCPU`` and ``AutogradCUDA`` kernels):
the same gradient, ``∂/∂g = Σ grad_w · v / ‖v‖`` and ``∂/∂v = (g / ‖v‖) (grad_w − v · Σ grad_w ·
v / ‖v‖²)``, with ``‖v‖`` recomputed from ``v`` (``torch.norm_except_dim``), so that autograd
differentiates the norm too. The user's own backward pass (not recorded) still runs the fused
backward kernel, so gradients and the training trajectory are bit for bit what they are
without it (tested). The registration is process-wide, done once, the first time a Cockpit
quantity needs Hessian-vector products (``cockpit_lite.curvature.derivatives``).
"""

import torch

OPERATOR = "_weight_norm_differentiable_backward"


def _differentiable_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """``(∂/∂v, ∂/∂g)`` of ``w = g · v / ‖v‖`` for the output gradient ``grad_w``, differentiable in all three
    (``saved_norms``, the forward pass's, is not read: it has no derivative)."""
    norms = torch.norm_except_dim(saved_v, 2, dim)
    axes = [axis for axis in range(saved_v.dim()) if axis != dim % saved_v.dim()] if dim != -1 else None
    dot = (grad_w * saved_v).sum(axes, keepdim=True) if axes is not None else (grad_w * saved_v).sum()
    grad_v = (saved_g / norms) * (grad_w - saved_v * (dot / norms**2))
    return grad_v, (dot / norms).reshape(saved_g.shape)


def enable_double_backward(register):
    """Register the differentiable weight-norm backward with ``register(operator, kernel, dispatch
    keys)`` (``cockpit_lite.curvature.derivatives``). Returns whether it is in place (``False`` on a
    PyTorch without the operator)."""
    if not hasattr(torch.ops.aten, OPERATOR):
        return False
    return register(OPERATOR, _differentiable_backward, ("AutogradCPU", "AutogradCUDA"))
