"""``cockpit_lite.engine.capture``: what the forward capture keeps of a tracked step's calls."""

import gc
import weakref

import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import GradVariance, NormTest


class Residual(nn.Module):
    """A Linear whose output only a residual addition reads (autograd saves no copy of it)."""

    def __init__(self):
        super().__init__()
        self.inner, self.head = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.inner(x) + x))


def test_outputs_autograd_does_not_keep_are_freed_and_still_report_their_gradient():
    """The capture keeps a stand-in of each output (its graph node and shape), not the tensor: the
    inner Linear's output is freed after the forward pass as without a Cockpit (a language model's
    logits are the size of the batch times the vocabulary), and its δ still arrives."""
    torch.manual_seed(0)
    model = Residual()
    outputs = []
    model.inner.register_forward_hook(lambda module, args, output: outputs.append(weakref.ref(output)))
    cp = Cockpit(model, [NormTest(), GradVariance()], diagnose=False)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    for step in range(2):
        loss = nn.functional.cross_entropy(model(x), y)
        gc.collect()
        assert outputs[-1]() is None
        model.zero_grad()
        with cp(step, info={"loss": loss}):
            loss.backward()
    record = cp.get_output()[1]
    losses = nn.functional.cross_entropy(model(x), y, reduction="none")  # one forward pass, a loop of grads
    individual = torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        losses[n], list(model.parameters()), retain_graph=True)]) for n in range(8)]).double()
    g = individual.mean(0)
    expected = ((individual - g) ** 2).sum() / (7 * 8 * (g**2).sum())
    assert not record.get("flags") and abs(record["NormTest"] - float(expected.sqrt())) < 1e-5 * float(expected.sqrt())
