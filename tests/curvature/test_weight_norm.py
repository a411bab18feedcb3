"""``cockpit_lite/curvature/weight_norm.py``: Hessian-vector products through ``weight_norm`` against the
Hessian of the same function written out (``g · v / ‖v‖`` from plain operators, float64)."""

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

from cockpit_lite.curvature import derivatives
from cockpit_lite.curvature.hvp import HessianVectorProducts

DIMS = (0, 1, -1)


def _written_out(v, g, dim):
    """``torch._weight_norm(v, g, dim)`` from plain operators (twice differentiable)."""
    if dim == -1:
        return v * (g / v.norm())
    axes = [a for a in range(v.dim()) if a != dim]
    return v * (g / torch.linalg.vector_norm(v, dim=axes, keepdim=True))


def _inputs(dim, shape=(3, 4, 2)):
    generator = torch.Generator().manual_seed(0)
    v = torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
    g_shape = () if dim == -1 else [size if axis == dim else 1 for axis, size in enumerate(shape)]
    g = torch.randn(g_shape, generator=generator, dtype=torch.float64, requires_grad=True)
    return v, g


@pytest.mark.parametrize("dim", DIMS)
def test_the_fused_weight_norm_passes_gradgradcheck(dim):
    """PyTorch's own differentiable backward of the fused weight norm (dim 0) fails ``gradgradcheck``
    (torch 2.13: it takes the saved norms for constants); with the registration every ``dim`` passes, and
    the forward is the written-out one."""
    derivatives.enable()
    v, g = _inputs(dim)
    torch.testing.assert_close(torch._weight_norm(v, g, dim), _written_out(v, g, dim))
    assert torch.autograd.gradgradcheck(lambda v, g: torch._weight_norm(v, g, dim), (v, g))


def test_the_users_backward_is_pytorchs_fused_kernel_bit_for_bit():
    """The gradient of the user's (unrecorded) backward pass is the fused kernel's own, whose derivative is
    the one replaced: the training trajectory is unchanged."""
    derivatives.enable()
    v, g = _inputs(0)
    w, norms = torch.ops.aten._weight_norm_interface(v, g, 0)
    grad_w = torch.randn(w.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fused = torch._weight_norm(v, g, 0)
    assert type(fused.grad_fn).__name__ == "WeightNormInterfaceBackward0"
    got = torch.autograd.grad(fused, (v, g), grad_w)
    with torch._C._AutoDispatchBelowAutograd():
        kernel = torch.ops.aten._weight_norm_interface_backward(grad_w, v.detach(), g.detach(), norms.detach(), 0)
    assert all(torch.equal(a, b) for a, b in zip(got, kernel))


class _WeightNormed(nn.Module):
    """A weight-normalised Linear and Conv1d (audio and GAN models), tanh, a plain head."""

    def __init__(self):
        super().__init__()
        self.lin = parametrizations.weight_norm(nn.Linear(4, 3))
        self.conv = parametrizations.weight_norm(nn.Conv1d(1, 2, 2), dim=1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = torch.tanh(self.lin(x)).unsqueeze(1)
        return self.head(torch.tanh(self.conv(h)).flatten(1))


def _loss_written_out(model, flat, x, y):
    """The loss of ``model`` at the flattened parameters ``flat``, each weight norm written out."""
    tensors = dict(zip([n for n, _ in model.named_parameters()],
                       torch.split(flat, [p.numel() for p in model.parameters()])))
    shaped = {n: t.reshape(p.shape) for (n, p), t in zip(model.named_parameters(), tensors.values())}
    h = torch.tanh(nn.functional.linear(x, _written_out(shaped["lin.parametrizations.weight.original1"],
                                                        shaped["lin.parametrizations.weight.original0"], 0),
                                        shaped["lin.bias"])).unsqueeze(1)
    conv = _written_out(shaped["conv.parametrizations.weight.original1"], shaped["conv.parametrizations.weight.original0"], 1)
    h = torch.tanh(nn.functional.conv1d(h, conv, shaped["conv.bias"])).flatten(1)
    return nn.functional.cross_entropy(nn.functional.linear(h, shaped["head.weight"], shaped["head.bias"]), y)


def test_hessian_vector_products_equal_the_written_out_hessian():
    """The products the Cockpit's curvature quantities take, through both layers' weight norms, against
    the autograd Hessian of the written-out loss (symmetric; the fused one's was 0.24 from symmetric)."""
    derivatives.enable()
    torch.manual_seed(0)
    model = _WeightNormed().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    hessian = torch.autograd.functional.hessian(lambda f: _loss_written_out(model, f, x, y), flat)
    loss = nn.functional.cross_entropy(model(x), y)
    torch.testing.assert_close(loss, _loss_written_out(model, flat, x, y))
    products = HessianVectorProducts(loss, params, step=0)
    generator = torch.Generator().manual_seed(2)
    for _ in range(3):
        vectors = [torch.randn(p.shape, generator=generator, dtype=torch.float64) for p in params]
        got = torch.cat([h.reshape(-1) for h in products.hvp(vectors)])
        torch.testing.assert_close(got, hessian @ torch.cat([v.reshape(-1) for v in vectors]), rtol=1e-10, atol=1e-12)
    products.release()
