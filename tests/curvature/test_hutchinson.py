"""Hessian-vector products of Hutchinson's estimator against the autograd Hessian (float64)."""

import pytest
import torch

from cockpit_lite.curvature import hutchinson


def _problem(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    params = list(model.parameters())
    sizes = [p.numel() for p in params]

    def loss_of(flat):
        chunks = torch.split(flat, sizes)
        weights = [c.reshape(p.shape) for c, p in zip(chunks, params)]
        hidden = torch.tanh(x @ weights[0].T + weights[1])
        return torch.nn.functional.cross_entropy(hidden @ weights[2].T + weights[3], y)

    flat = torch.cat([p.detach().reshape(-1) for p in params])
    hessian = torch.autograd.functional.hessian(loss_of, flat)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    return params, grads, hessian


@pytest.mark.parametrize("count", (1, 2, 3, 7))
def test_products_equal_the_hessian_times_the_probes(count):
    params, grads, hessian = _problem(count)
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):
        probes = [torch.randint(0, 2, (count, *p.shape), generator=generator).double() * 2 - 1 for p in params]
        products = hutchinson.hessian_vector_products(params, grads, probes)
        flat_probes = torch.cat([z.reshape(count, -1) for z in probes], 1)
        expected = flat_probes @ hessian  # H is symmetric: row k is (H z_k)ᵀ
        got = torch.cat([h.reshape(count, -1) for h in products], 1)
        assert got.shape == (count, hessian.shape[0])
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
