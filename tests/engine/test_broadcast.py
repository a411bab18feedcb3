"""Shared tensors (rules of ``cockpit_lite/engine/broadcast.py``): each sample's gradient of a
tensor all samples share, against autograd on the individual losses of one forward pass."""

import pytest
import torch
from torch import nn

from cockpit_lite.engine import broadcast
from engine.test_rules import _global_path_uses, assert_matches_autograd, engine_individual_gradients, individual_reference

B, T, D = 3, 4, 5


class Shared(nn.Module):
    """A Linear layer on ``combine(x, shared)``, ``shared`` a parameter of the model itself."""

    def __init__(self, shape, combine):
        super().__init__()
        self.shared = nn.Parameter(torch.randn(*shape))
        self.combine = combine
        self.lin = nn.Linear(D, 2)

    def forward(self, x):
        return self.lin(self.combine(x, self.shared))


class _NoGradient(torch.autograd.Function):
    """The identity whose backward pass gives its input no gradient (``None``)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


COMBINE = {  # name: (shape of the shared tensor, how it meets the batch [B, T, D])
    "x_plus_shared": ((T, D), lambda x, s: x + s),
    "shared_plus_x": ((T, D), lambda x, s: s + x),
    "x_minus_shared": ((T, D), lambda x, s: x - s),
    "shared_minus_x": ((T, D), lambda x, s: s - x),
    "add_alpha": ((T, D), lambda x, s: torch.add(x, s, alpha=2.5)),
    "shared_first_add_alpha": ((T, D), lambda x, s: torch.add(s, x, alpha=2.5)),  # alpha scales x, not s
    "sub_alpha": ((T, D), lambda x, s: torch.sub(x, s, alpha=0.5)),
    "times_scale": ((D,), lambda x, s: x * s),  # not an addition: the node's backward per sample
    "sliced_and_unsqueezed": ((T + 3, D), lambda x, s: x + s[:T].unsqueeze(0)),  # shape-only nodes
    "viewed_transposed": ((D, T), lambda x, s: x + s.t().reshape(1, T, D)),
    "broadcast_over_positions": ((D,), lambda x, s: x + s),  # summed over T per sample
    "broadcast_column": ((T, 1), lambda x, s: x + s),  # summed over D per sample
    "broadcast_over_pairs": ((D,), lambda x, s: x[:, :2] + s),  # summed over an axis of size 2
    # elementwise nodes that keep the shared tensor's shape bring no sample in: carried back through
    "scaled_before_the_batch": ((T, D), lambda x, s: x + 2 * s),
    "masked_before_the_batch": ((T, D), lambda x, s: x + torch.where(torch.arange(D) < 3, s, -1.0)),
    # several consumers: a path through each, their per-sample gradients summed
    "used_twice": ((T, D), lambda x, s: x + s + s),
    "squared_before_the_batch": ((T, D), lambda x, s: x + s * s),  # two uses in one node
    "in_two_layers": ((T, D), lambda x, s: torch.tanh(x + s) + x * s.unsqueeze(0)),
    "one_path_without_a_gradient": ((T, D), lambda x, s: torch.tanh(x + s) + _NoGradient.apply(x * s)),
}


NOT_SHARED = {  # the shared tensor has no path to the nodes that bring in the batch
    "through_a_nonlinearity": ((T, D), lambda x, s: x + torch.tanh(s)),
    "one_use_without_a_path": ((T, D), lambda x, s: x + s + s.sum()),
}


@pytest.mark.parametrize("combine", [*COMBINE, *NOT_SHARED], ids=str)
def test_shared_tensor_gradients_per_sample(combine, monkeypatch):
    """Served by the broadcast path, or (``NOT_SHARED``) left to the global path; exact either way."""
    shape, how = COMBINE.get(combine) or NOT_SHARED[combine]
    torch.manual_seed(0)
    model = Shared(shape, how).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    used = _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    if combine in NOT_SHARED:
        assert used and 0 in used[0]  # the shared parameter
    else:
        assert not any(used), f"served by the global path: {used}"


INDEXED = {  # a table read at an index
    "index": lambda table, index: table[index],
    "index_select": lambda table, index: table.index_select(0, index),
    "embedding": lambda table, index: nn.functional.embedding(index, table),
    "gather": lambda table, index: table.gather(0, index[:, None].expand(-1, table.shape[1])),
}


@pytest.mark.parametrize("length", [T, B], ids=["T", "T=B"])
@pytest.mark.parametrize("read", INDEXED, ids=str)
def test_a_table_read_at_an_index_then_meeting_the_batch(read, length, monkeypatch):
    """A table read at positions (a relative-position bias ``table[index]``, ``pos[arange(T)]``) and added to
    every sample: carried back through the read to the addition, where the batch comes in. With T = B the
    read's output is as long as the batch, as a batched index's (token embeddings) would be: the global
    path, exact. Before, a read as long as the batch was taken for the node where the batch comes in, and
    each position's gradient for a sample's (GradVariance of a Swin-like bias table 3-10x off, no flag; the
    sum was right); a shorter one was not followed (the global path)."""
    torch.manual_seed(0)
    positions = torch.arange(length) + length - 1
    model = Shared((2 * length - 1, D), lambda x, table: x + INDEXED[read](table, positions)).double()
    x = torch.randn(B, length, D, dtype=torch.float64)
    used = _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    assert (bool(used) and 0 in used[0]) == (length == B), used


class SequenceFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Parameter(torch.randn(D))
        self.lin = nn.Linear(D, 2)

    def forward(self, x):  # x: [T, B, D]
        return self.lin(x + self.shared)


def test_a_shared_tensor_meeting_a_sequence_first_batch(monkeypatch):
    """The batch axis is not the first: each sample's part is summed over the axes before it too."""
    torch.manual_seed(0)
    model = SequenceFirst().double()
    x = torch.randn(T, B, D, dtype=torch.float64)
    used = _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, x, batch_size=B)
    for index, reference in enumerate(individual_reference(model, x, axis=1)):
        torch.testing.assert_close(got[index], reference)
    assert not any(used)


def _paths_planned(monkeypatch):
    planned = []
    original = broadcast.Path.__init__

    def spy(self, *args, **kwargs):
        planned.append(args[1])  # the shared tensor's shape
        original(self, *args, **kwargs)

    monkeypatch.setattr(broadcast.Path, "__init__", spy)
    return planned


@pytest.mark.parametrize("features", [4, B])  # also a layer whose width equals the batch size
def test_batched_layers_plan_no_broadcast_path(features, monkeypatch):
    """Only tensors the samples share take the broadcast path; a layer's batched output (even
    one with another axis of size B) is served by the layer's own rule."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, features), nn.ReLU(), nn.Linear(features, 2)).double()
    planned = _paths_planned(monkeypatch)
    engine_individual_gradients(model, torch.randn(B, T, D, dtype=torch.float64))
    assert planned == []


ONE_SAMPLE = {  # layers on a batch of one sample [1, 4, 5]: every axis of size 1 is as long as the batch
    "linear": lambda: nn.Linear(5, 3),
    "conv": lambda: nn.Conv1d(4, 3, 2),
    "groupnorm": lambda: nn.GroupNorm(2, 4),
    "batchnorm_eval": lambda: nn.BatchNorm1d(4).eval(),
}


@pytest.mark.parametrize("layer", ONE_SAMPLE, ids=str)
def test_a_batch_of_one_sample_is_served_by_the_layers_own_rules(layer, monkeypatch):
    """Nothing is broadcast into a batch of one (an axis of size 1 is no broadcast): each layer's
    own rule, no broadcast path, no global path, no flag."""
    torch.manual_seed(0)
    model = nn.Sequential(ONE_SAMPLE[layer](), nn.Flatten()).double()
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-2, 2)
    planned = _paths_planned(monkeypatch)
    assert_matches_autograd(model, torch.randn(1, 4, 5, dtype=torch.float64), monkeypatch)
    assert planned == []


def test_a_shared_tensor_as_long_as_the_batch_plans_its_path(monkeypatch):
    """``s[:B]`` with T = B: a length equal to B, but broadcast into the batch at the addition."""
    torch.manual_seed(0)
    model = Shared((B, D), lambda x, s: x[:, :B] + s).double()
    planned = _paths_planned(monkeypatch)
    x = torch.randn(B, T, D, dtype=torch.float64)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    assert planned == [(B, D)]



def test_a_shared_tensor_as_long_as_the_batch_computed_on_before_the_batch(monkeypatch):
    """``x[:, :B] + 2 s`` with ``s`` of shape ``[B, D]``: the product's output is as long as the
    batch, but its axis of size B is ``s``'s own (no sample is in it yet). It is not taken for the
    batch node (it was: each row of ``s`` a "sample", their sum 3.1 away from autograd's): it keeps
    ``s``'s shape, so the path goes through it to the addition, where the batch comes in; exact."""
    torch.manual_seed(0)
    model = Shared((B, D), lambda x, s: x[:, :B] + 2 * s).double()
    planned = _paths_planned(monkeypatch)
    used = _global_path_uses(monkeypatch)
    x = torch.randn(B, T, D, dtype=torch.float64)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    assert planned == [(B, D)] and not any(used)


COMPUTED_BEFORE = {  # operations on the shared tensor alone that the path's shapes cannot tell from the batch's
    "matrix_product": lambda x, s: x[:, :B] + s @ torch.eye(D, dtype=s.dtype).flip(0),
    "running_sum_of_tanh": lambda x, s: x[:, :B] + torch.tanh(s).cumsum(0),
}


@pytest.mark.parametrize("how", COMPUTED_BEFORE, ids=str)
def test_rows_a_path_would_read_where_no_sample_is_yet_are_found_by_the_probe(how, monkeypatch):
    """``x[:, :B] + s @ P`` with ``s`` of shape ``[B, D]``: the product is the first operation that is
    neither shape-only nor elementwise, its output is as long as the batch, and the path took it for the
    node where the batch comes in (each row of ``s`` a "sample", silently: their sum is right). The
    independence probe now checks the rows a path would read there as it checks a layer's: mixed, so the
    global path, exact."""
    torch.manual_seed(0)
    model = Shared((B, D), COMPUTED_BEFORE[how]).double()
    used = _global_path_uses(monkeypatch)
    x = torch.randn(B, T, D, dtype=torch.float64)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    assert 0 in used[0]


@pytest.mark.parametrize("layer", ["linear", "conv1d"])
def test_a_weight_normalised_layer_as_wide_as_the_batch(layer, monkeypatch):
    """``weight_norm`` (audio and GAN models) with as many outputs as samples: the
    parametrisation computes the weight (``[B, D]``, ``[B, 1, 3]``) from ``g`` and ``v`` alone,
    and the shapes took its first axis for the batch (``g`` and ``v`` 1.7 and 1.2 away from
    autograd's, NaN with a flag, then the slow global path). A call with no input that can hold a
    sample is shared: the broadcast path, exact, no flag."""
    from torch.nn.utils import parametrizations

    torch.manual_seed(0)
    if layer == "linear":
        inner, features, x = nn.Linear(D, B), B, torch.randn(B, D, dtype=torch.float64)
    else:
        inner, features, x = nn.Conv1d(1, B, 3), B * (D - 2), torch.randn(B, 1, D, dtype=torch.float64)
    model = nn.Sequential(parametrizations.weight_norm(inner), nn.Tanh(), nn.Flatten(), nn.Linear(features, 2)).double()
    used = _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    assert not any(used)



class MaskedRelativeBias(nn.Module):
    """T5's decoder self-attention in small: a learned bias per relative position (an Embedding of the
    ``[T, T]`` bucket indices, shared by every sample), causally masked with ``torch.where`` before it is
    added to each sample's scores ``[B, T, T]``."""

    def __init__(self, length):
        super().__init__()
        self.bias = nn.Embedding(length, 1)
        self.value = nn.Linear(D, D)
        self.length = length

    def forward(self, x):
        positions = torch.arange(self.length, device=x.device)
        buckets = (positions[:, None] - positions[None, :]).clamp(min=0)
        causal = positions[:, None] >= positions[None, :]
        bias = torch.where(causal, self.bias(buckets)[..., 0], torch.tensor(-1e4, dtype=x.dtype))
        scores = x @ x.transpose(1, 2) + bias
        return scores.softmax(-1) @ self.value(x)


@pytest.mark.parametrize("length", [T, B])  # also as long as the batch: two axes of size B
def test_a_masked_relative_position_bias_as_long_as_the_batch(length, monkeypatch):
    """With T = B the bias table's lookup ``[B, B, 1]`` looked batched: the Embedding rule took the buckets'
    first axis for the samples (each row's gradient a "sample"; their sum is right, so the check against
    autograd's gradient passed, and NormTest of T5's decoder bias came out 1.354 against 1.276). The mask
    keeps the shape and brings no batch in: shared, and exact. The path goes through the mask to the
    addition, where the batch comes in (it stopped at the mask, and T5's decoder bias took the global
    path at every step)."""
    torch.manual_seed(0)
    model = MaskedRelativeBias(length).double()
    x = torch.randn(B, length, D, dtype=torch.float64)
    used = _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    assert not any(used), used


class Tanh(nn.Module):
    """A custom layer (the generic rule): ``tanh(x · w) + b``."""

    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(D)), nn.Parameter(torch.randn(D))

    def forward(self, x):
        return torch.tanh(x * self.w) + self.b


class ScaledTanh(Tanh):
    """The custom layer with a tensor passed by keyword: ``scale · tanh(x · w) + b``."""

    def forward(self, x, scale=None):
        return scale * super().forward(x)


class Learned(Tanh):
    """The custom layer called without inputs: ``tanh(w) + b``."""

    def forward(self):
        return torch.tanh(self.w) + self.b


class LayerOnShared(nn.Module):
    """``head(x + layer(table))``: a layer whose input and output every sample shares (an
    MLP over a positional table, a relative-position bias). ``keyword``: the table passed as
    ``input=``, or (``"scale"``) a shared scale passed as ``scale=``, or (``"none"``) the layer
    called without inputs."""

    def __init__(self, layer, keyword, table):
        super().__init__()
        self.layer, self.keyword = layer, keyword
        if table == "parameter":
            self.table = nn.Parameter(torch.randn(T, D))
        else:
            self.register_buffer("table", torch.randn(T, D))
        self.head = nn.Linear(D, 2)

    def forward(self, x):
        if self.keyword == "none":
            shared = self.layer()
        elif self.keyword == "scale":
            shared = self.layer(self.table, scale=torch.linspace(0.5, 2.0, D, dtype=x.dtype))
        else:
            shared = self.layer(input=self.table) if self.keyword else self.layer(self.table)
        return self.head(x + shared)


ON_SHARED = {  # name: (layer, called with a keyword, the table, global-path parameter indices)
    "linear_on_a_parameter": (lambda: nn.Linear(D, D), False, "parameter", [0]),
    "linear_on_a_buffer": (lambda: nn.Linear(D, D), False, "buffer", []),
    "linear_called_with_a_keyword": (lambda: nn.Linear(D, D), True, "buffer", [0, 1]),
    "layernorm_on_a_parameter": (lambda: nn.LayerNorm(D), False, "parameter", [0]),
    "custom_layer_on_a_buffer": (Tanh, False, "buffer", []),
    "custom_layer_with_a_keyword_tensor": (ScaledTanh, "scale", "buffer", []),
    "custom_layer_without_inputs": (Learned, "none", "buffer", []),
}


@pytest.mark.parametrize("case", ON_SHARED, ids=str)
def test_a_layer_on_a_shared_tensor(case, monkeypatch):
    """Served by its rule on the broadcast path (as if every sample had made the call), or left
    to the global path (a keyword input; a shared parameter in a layer's input), exact either
    way, with no flag; the global path's own backward passes must not fire the broadcast hooks."""
    layer, keyword, table, expected = ON_SHARED[case]
    torch.manual_seed(0)
    model = LayerOnShared(layer(), keyword, table).double()
    assert_matches_autograd(model, torch.randn(B, T, D, dtype=torch.float64), monkeypatch, global_path=expected)


class SharedBiasTwice(nn.Module):
    """T5's layout in small: one causally masked relative-position bias, computed once and added to the
    scores of two attention layers."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Embedding(T, 1)
        self.values = nn.ModuleList([nn.Linear(D, D), nn.Linear(D, D)])

    def forward(self, x):
        positions = torch.arange(x.shape[1], device=x.device)
        causal = positions[:, None] >= positions[None, :]
        bias = torch.where(causal, self.bias((positions[:, None] - positions[None, :]).clamp(min=0))[..., 0], -1e4)
        for value in self.values:
            x = x + ((x @ x.transpose(1, 2) + bias).softmax(-1) @ value(x))
        return x.sum(1)


def test_a_bias_shared_by_two_layers_under_gradient_accumulation(monkeypatch):
    """Two micro-batches of 3 behind one optimizer step, each loss divided by 2: GradVariance of the union
    (g̃_n = 6 ∇c_n, each c_n from its own micro-batch's forward pass) against autograd, the bias by its two
    paths, no parameter on the global path."""
    from cockpit_lite import Cockpit, quantities

    used = _global_path_uses(monkeypatch)
    torch.manual_seed(0)
    model = SharedBiasTwice().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    cp = Cockpit(model, [quantities.GradVariance()], diagnose=False, accumulate=True, strict=True)
    g = torch.Generator().manual_seed(1)
    micro = [torch.randn(3, T, D, generator=g, dtype=torch.float64) for _ in range(2)]
    for x in micro:
        loss = (model(x) ** 2).sum(1).mean() / 2
        with cp(0, info={"loss": loss, "optimizer": opt}):
            loss.backward()
    opt.step()
    terms = torch.cat([(model(x) ** 2).sum(1) / 3 / 2 for x in micro])
    params = list(model.parameters())
    rows = [torch.autograd.grad(terms[n], params, retain_graph=True) for n in range(6)]
    expected = [torch.stack([6 * r[i].reshape(-1) for r in rows]).var(0).sum() for i in range(len(params))]
    torch.testing.assert_close(torch.tensor(cp.get_output()[0]["GradVariance"], dtype=torch.float64),
                               torch.stack(expected))
    assert not any(used), used
