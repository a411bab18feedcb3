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


class Counting(nn.Module):
    """A layer whose forward pass updates a buffer before it uses it (as ``spectral_norm``'s power iteration
    moves its vectors), and a child whose buffer it leaves alone."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.register_buffer("calls", torch.zeros(()))
        self.child = nn.BatchNorm1d(3).eval()

    def forward(self, x):
        self.calls.add_(1)
        return self.child(x) * self.scale * self.calls


def test_a_call_knows_whether_the_module_s_buffers_moved_and_keeps_copies_when_asked():
    """``Call.buffers_moved``: in-place updates of the module's buffers (its children's included) since the
    call began; ``snapshot``: the module's buffers as the call found them, copies the forward pass does not
    touch. A module without buffers records nothing."""
    from cockpit_lite.engine.capture import ForwardCapture

    layer, plain = Counting(), nn.Linear(3, 3)
    capture = ForwardCapture({layer: "layer", plain: "plain"}, on_grad=lambda *args: None)
    capture.snapshot.add(layer)
    capture.arm()
    x = torch.randn(4, 3, requires_grad=True)
    plain(layer(x))
    layer(x)
    first, linear, second = capture.calls
    capture.disarm()
    assert linear.buffers_before is None and linear.buffers is None and not linear.buffers_moved()
    assert first.buffers_moved() and second.buffers_moved()  # the second call moved the first's too
    assert [float(call.buffers["calls"]) for call in (first, second)] == [0.0, 1.0]
    assert set(first.buffers) == {"calls", "child.running_mean", "child.running_var", "child.num_batches_tracked"}
    assert float(layer.calls) == 2.0
