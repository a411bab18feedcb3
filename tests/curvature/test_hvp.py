"""Hessian-vector products taken before the user's backward pass, against the autograd Hessian (float64)."""

import pytest
import torch

import problems

from cockpit_lite.curvature.hvp import HessianVectorProducts


class _WithSpare(torch.nn.Module):
    """Linear-tanh-linear, plus a layer the loss never uses and a frozen scale."""

    def __init__(self):
        super().__init__()
        self.first, self.last, self.spare = torch.nn.Linear(4, 3), torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)
        self.scale = torch.nn.Parameter(torch.tensor(1.5), requires_grad=False)

    def forward(self, x):
        return self.last(torch.tanh(self.first(x))) * self.scale


def _problem(seed):
    torch.manual_seed(seed)
    model = _WithSpare().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    names = [n for n, _ in model.named_parameters()]

    def loss_of(flat):
        tensors = {n: c.reshape(p.shape) for n, c, p in zip(names, torch.split(flat, sizes), params)}
        return torch.nn.functional.cross_entropy(torch.func.functional_call(model, tensors, (x,)), y)

    flat = torch.cat([p.detach().reshape(-1) for p in params])
    hessian = torch.autograd.functional.hessian(loss_of, flat)
    frozen = torch.cat([torch.full((p.numel(),), not p.requires_grad) for p in params])
    hessian[frozen], hessian[:, frozen] = 0, 0  # a frozen parameter is a constant: no curvature
    loss = torch.nn.functional.cross_entropy(model(x), y)
    return params, loss, hessian


@pytest.mark.parametrize("seed", (0, 1))
def test_products_equal_the_hessian_times_the_vectors(seed):
    """Zeros for the unused layer and the frozen scale; the graph is dropped on release; the
    forward graph stays for the user's backward, and no gradient is left on the parameters."""
    params, loss, hessian = _problem(seed)
    products = HessianVectorProducts(loss, params, step=0)
    generator = torch.Generator().manual_seed(seed)
    for count in range(1, 4):
        vectors = [torch.randn(p.shape, generator=generator, dtype=torch.float64) for p in params]
        got = torch.cat([h.reshape(-1) for h in products.hvp(vectors)])
        expected = hessian @ torch.cat([v.reshape(-1) for v in vectors])
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
        assert products.count == count
    assert all(p.grad is None for p in params)
    products.release()
    loss.backward()  # the forward graph is intact
    assert sum(p.grad is not None for p in params) == 4  # first and last layer


def test_a_loss_without_graph_names_the_fix():
    params, loss, _ = _problem(0)
    products = HessianVectorProducts(loss.detach(), params, step=3)
    with pytest.raises(ValueError, match=r"step 3: info\['loss'\] has no autograd graph.*Fix: pass the loss tensor"):
        products.hvp([torch.zeros_like(p) for p in params])


@pytest.mark.parametrize("device", problems.CPU_AND_CUDA)
def test_a_backward_pass_that_recomputes_a_dropout_leaves_the_random_state_alone(device):
    """A dropout recomputed in the backward pass from the random state of that moment
    (``torch.utils.checkpoint`` without ``preserve_rng_state``) draws from a forked one, in the
    gradient with graph and in the products (CPU and the parameters' GPU)."""
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Dropout(0.5)).double().to(device)
    x = torch.randn(6, 4, dtype=torch.float64, device=device)
    out = torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False, preserve_rng_state=False)
    params = list(inner.parameters())
    states = problems.random_states(device)
    products = HessianVectorProducts((out**2).sum(), params, step=0)
    for _ in range(2):
        products.hvp([torch.ones_like(p) for p in params])
    assert all(torch.equal(a, b) for a, b in zip(states, problems.random_states(device)))
