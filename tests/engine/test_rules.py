"""Individual-gradient rules against a per-sample autograd loop."""

import copy
import warnings

import pytest
import torch
from torch import nn

import problems

from cockpit_lite.engine import Engine
from cockpit_lite.engine.rules import attention
from cockpit_lite.info import StepInfo
from cockpit_lite.engine.transforms import Transform

CONVS = {
    "plain": dict(kernel_size=3),
    "padded_strided": dict(kernel_size=3, padding=1, stride=2),
    "dilated_rect": dict(kernel_size=(2, 3), dilation=(2, 1), padding=(1, 0)),
    "grouped": dict(kernel_size=3, groups=2, padding=1),
    "same_padding": dict(kernel_size=3, padding="same"),
    "same_padding_even_kernel": dict(kernel_size=4, padding="same"),  # one more on the right: padded explicitly
    "same_padding_even_first_kernel": dict(kernel_size=(4, 3), padding="same"),  # asymmetric along one axis only
    "reflect": dict(kernel_size=3, padding=1, padding_mode="reflect"),
}


class Keep(Transform):
    """Record the individual gradients themselves (for the test only)."""

    key = "keep"
    per_sample_output = True

    def __call__(self, per_sample):
        return per_sample.grad_batch.clone()


LAYERS = {"1d": (nn.Conv1d, (7,)), "2d": (nn.Conv2d, (7, 6)), "3d": (nn.Conv3d, (5, 4, 5))}


def engine_individual_gradients(model, x, batch_size=None, wide=False, subset=None, keep=None, params=None):
    """``grad_batch`` of every trainable parameter for the loss ``Σ model(x)²``, from the engine
    (``batch_size``: as ``info["batch_size"]``, for sequence-first inputs; else the samples'
    losses are given too, for the global path; ``wide``: the loss in float32, as under mixed
    precision; ``subset``: the drawn samples of a subsampled step; ``keep``: a ``Keep`` of
    the caller's; ``params``: the tracked parameters in the caller's order, default the model's
    trainable ones)."""
    params = [p for p in model.parameters() if p.requires_grad] if params is None else params
    engine = Engine(model, params, [str(i) for i in range(len(params))])
    out = model(x).float() if wide else model(x)
    if batch_size is None:
        individual = (out**2).reshape(len(x), -1).sum(1)
        loss = individual.sum()
        given = {"loss": loss, "individual_losses": individual}
    else:
        loss = (out**2).sum()
        given = {"loss": loss, "batch_size": batch_size}
    info = StepInfo(given, 0, batch_size=engine.batch_size(), model=model)
    info.subset = subset
    engine.begin([keep or Keep()], info, info.batch_size, [None] * len(params), ["Test"])
    loss.backward()
    results, _, flags = engine.finish()
    assert not flags, flags
    return [results[i]["keep"] for i in range(len(params))]


def individual_reference(model, x, axis=0):
    """Per sample (along ``axis`` of ``x``), autograd of its loss ``Σ model(x)²`` in one forward
    pass, for every trainable parameter (zeros for one the loss does not use)."""
    out = model(x)
    individual = (out.movedim(axis, 0) ** 2).reshape(x.shape[axis], -1).sum(1)
    return [torch.stack([_grad(individual[n], p) for n in range(x.shape[axis])]) for p in model.parameters() if p.requires_grad]


def _grad(value, param):
    grad = torch.autograd.grad(value, param, retain_graph=True, allow_unused=True)[0]
    return torch.zeros_like(param) if grad is None else grad


def assert_rule_matches_a_sample_loop(layer, x):
    """Every parameter's individual gradients against autograd on one sample at a time."""
    model = nn.Sequential(layer, nn.Flatten())
    got = engine_individual_gradients(model, x)
    for index, p in enumerate(model.parameters()):
        loop = torch.stack([torch.autograd.grad((model(x[n : n + 1]) ** 2).sum(), p)[0] for n in range(len(x))])
        torch.testing.assert_close(got[index], loop)


@pytest.mark.parametrize("config", CONVS, ids=str)
@pytest.mark.parametrize("dim", LAYERS, ids=str)
def test_conv_rule_matches_a_sample_loop(config, dim, monkeypatch):
    """BackPACK's BatchGrad is wrong for "same" and reflect padding; ours must not be."""
    layer_type, size = LAYERS[dim]
    kwargs = dict(CONVS[config])
    if dim != "2d":
        kwargs = {k: (v[0] if isinstance(v, tuple) else v) for k, v in kwargs.items()}
    torch.manual_seed(0)
    x = torch.randn(3, 4, *size, dtype=torch.float64)
    used = _global_path_uses(monkeypatch)
    assert_rule_matches_a_sample_loop(layer_type(4, 6, **kwargs).double(), x)
    assert used == []


@pytest.mark.parametrize("sequence", [(), (5,), (2, 3)], ids=str)
def test_linear_rule_matches_a_sample_loop(sequence):
    """Weight (factored) and bias, also for inputs with sequence axes ``[B, *L, I]``."""
    torch.manual_seed(0)
    x = torch.randn(3, *sequence, 4, dtype=torch.float64)
    assert_rule_matches_a_sample_loop(nn.Linear(4, 6).double(), x)


class SelfAttention(nn.Module):
    def __init__(self, batch_first, cross=False, bias=True, **options):
        super().__init__()
        self.attn = nn.MultiheadAttention(6, 2, batch_first=batch_first, bias=bias, **options)
        self.cross = cross

    def forward(self, x):
        memory = torch.tanh(x) if self.cross else x
        return self.attn(x, memory, memory, need_weights=False)[0]


def _attention_served(monkeypatch):
    """The MultiheadAttention calls served from their projections in the graph (rules/attention.py)."""
    served = []
    original = attention.AttentionHooks.__init__

    def spy(self, nodes, tracked, *args):
        served.append(sorted(name for name, _, _ in tracked))
        original(self, nodes, tracked, *args)

    monkeypatch.setattr(attention.AttentionHooks, "__init__", spy)
    return served


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_projections_match_a_sample_loop(batch_first, monkeypatch):
    """The projections read from the graph (rules/attention.py), both layouts."""
    torch.manual_seed(0)
    model = SelfAttention(batch_first).double()
    served = _attention_served(monkeypatch)
    x = torch.randn(3, 4, 6, dtype=torch.float64) if batch_first else torch.randn(4, 3, 6, dtype=torch.float64)
    got = engine_individual_gradients(model, x, batch_size=3)
    axis = 0 if batch_first else 1
    for index, p in enumerate(model.parameters()):
        loop = torch.stack([
            torch.autograd.grad((model(x.narrow(axis, n, 1)) ** 2).sum(), p)[0] for n in range(3)
        ])
        torch.testing.assert_close(got[index], loop)
    assert served == [["in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"]]


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_parameters_besides_the_projections_take_the_generic_rule(batch_first, monkeypatch):
    """``add_bias_kv=True``: the projections are read from the graph, ``bias_k`` and ``bias_v`` (keys and values
    appended to every sample's) by the generic rule. Before, the plan claimed them too and served nothing:
    the step raised (a gradient without a use)."""
    torch.manual_seed(0)
    model = SelfAttention(batch_first, add_bias_kv=True).double()
    x = torch.randn(3, 4, 6, dtype=torch.float64) if batch_first else torch.randn(4, 3, 6, dtype=torch.float64)
    served, used = _attention_served(monkeypatch), _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, x, batch_size=3)
    axis = 0 if batch_first else 1
    for index, p in enumerate(model.parameters()):
        loop = torch.stack([torch.autograd.grad((model(x.narrow(axis, n, 1)) ** 2).sum(), p)[0] for n in range(3)])
        torch.testing.assert_close(got[index], loop)
    assert served == [["in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"]] and used == []


ATTENTION_ELSEWHERE = {  # graph shapes the projections' plan does not read: the generic rule
    "cross_attention": dict(cross=True),
    "without_biases": dict(bias=False),
    "frozen_input_projection": dict(),
}


@pytest.mark.parametrize("case", ATTENTION_ELSEWHERE, ids=str)
def test_attention_the_plan_does_not_read_goes_to_the_generic_rule(case, monkeypatch):
    torch.manual_seed(0)
    model = SelfAttention(True, **ATTENTION_ELSEWHERE[case]).double()
    if case == "frozen_input_projection":
        model.attn.in_proj_weight.requires_grad_(False)
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    served, used = _attention_served(monkeypatch), _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    assert served == [] and used == []


class SharedLatents(nn.Module):
    """Self-attention over a latent array all samples share (``[5, 1, 6]``: its own batch of one),
    flattened and added to every sample."""

    def __init__(self):
        super().__init__()
        self.latent = nn.Parameter(torch.randn(5, 1, 6))
        self.attn = nn.MultiheadAttention(6, 2)

    def forward(self, x):
        return x + self.attn(self.latent, self.latent, self.latent, need_weights=False)[0].reshape(-1)


def test_attention_over_a_sequence_the_samples_share_is_not_read_from_its_projections(monkeypatch):
    """Its projections' rows (5) are no multiple of the batch (3): not served from the graph, nor
    by the generic rule as if every sample had made the call (axis 1, the batch axis of its
    sequence-first layout, is not the batch's there); exact (per-sample autograd of the
    individual losses of one forward pass)."""
    torch.manual_seed(0)
    model = SharedLatents().double()
    x = torch.randn(3, 30, dtype=torch.float64)
    served = _attention_served(monkeypatch)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model, x)):
        torch.testing.assert_close(got[index], reference)
    assert served == []


def test_huggingface_conv1d_rule_matches_a_sample_loop():
    """GPT-2's Conv1D (weight [in, out]) by the Linear rule with swapped factors."""
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils", reason="the hf extra is not installed")
    from cockpit_lite.engine.rules import TransposedLinearRule, rule_for

    torch.manual_seed(0)
    layer = pytorch_utils.Conv1D(6, 4).double()
    assert isinstance(rule_for(layer), TransposedLinearRule)
    assert_rule_matches_a_sample_loop(layer, torch.randn(3, 5, 4, dtype=torch.float64))


def _batchnorm_eval(channels, eps=1e-5):
    layer = nn.BatchNorm1d(channels, eps=eps)
    layer.running_mean.uniform_(-1, 1)
    layer.running_var.uniform_(0.5, 2)
    return layer.eval()


NORMS = {  # (layer, input shape after the batch of 3); every channel count differs from the batch
    "layernorm": (lambda: nn.LayerNorm(4), (5, 4)),
    "layernorm_2d": (lambda: nn.LayerNorm((2, 4)), (2, 4)),
    "rmsnorm": (lambda: nn.RMSNorm(4), (5, 4)),
    "rmsnorm_default_eps": (lambda: nn.RMSNorm((2, 4), eps=None), (2, 4)),
    "rmsnorm_large_eps": (lambda: nn.RMSNorm(4, eps=0.5), (5, 4)),
    "layernorm_large_eps": (lambda: nn.LayerNorm(4, eps=0.5), (5, 4)),
    "groupnorm": (lambda: nn.GroupNorm(2, 4), (4, 5)),
    "groupnorm_one_group_2d": (lambda: nn.GroupNorm(1, 4), (4, 2, 3)),
    "groupnorm_no_positions": (lambda: nn.GroupNorm(2, 4), (4,)),
    "batchnorm_eval": (lambda: _batchnorm_eval(4), (4, 5)),
    "batchnorm_eval_2d": (lambda: _batchnorm_eval(4), (4,)),
    "batchnorm_eval_large_eps": (lambda: _batchnorm_eval(4, eps=0.5), (4, 5)),
    "rmsnorm_width_one": (lambda: nn.RMSNorm(1), (5, 1)),
    "groupnorm_one_channel": (lambda: nn.GroupNorm(1, 1), (1, 5)),
}


def _random_affine(layer):
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-2, 2)
    return layer


@pytest.mark.parametrize("norm", NORMS, ids=str)
def test_norm_rules_match_a_sample_loop(norm):
    """x̂ recomputed with the statistics the layer used (rules/norm.py), random γ and β."""
    make, shape = NORMS[norm]
    torch.manual_seed(0)
    layer = _random_affine(make().double())
    assert_rule_matches_a_sample_loop(layer, 3 * torch.randn(3, *shape, dtype=torch.float64) + 1)


def test_a_training_batch_norm_normalises_with_the_batchs_statistics_and_its_own_eps(monkeypatch):
    """In training mode ``x̂`` uses the batch's mean and variance and the layer's ``eps`` (0.5 here,
    not the default): per-sample autograd of the individual losses of one forward pass."""
    torch.manual_seed(0)
    layer = _random_affine(nn.BatchNorm1d(4, eps=0.5).double())
    assert_matches_autograd(nn.Sequential(layer, nn.Flatten()), torch.randn(6, 4, 5, dtype=torch.float64), monkeypatch)


def test_group_norm_in_float32_matches_float64_channels_last_and_a_frozen_bias():
    """GroupNorm's sums from torch's backward kernel (``Σ δ x`` less ``mean · Σ δ``): in float32
    on inputs far from zero mean (|mean| 30 standard deviations), in channels-last memory, with
    only the weight trained, within float32's rounding of the float64 sample loop."""
    torch.manual_seed(0)
    layer = _random_affine(nn.GroupNorm(2, 6).double())
    layer.bias.requires_grad_(False)
    x = torch.randn(5, 6, 4, 3, dtype=torch.float64) + 30
    model = nn.Sequential(layer, nn.Flatten())
    loop = torch.stack([torch.autograd.grad((model(x[n : n + 1]) ** 2).sum(), layer.weight)[0] for n in range(len(x))])
    inputs = x.float().contiguous(memory_format=torch.channels_last).requires_grad_()  # (torch 2.13's own
    # channels-last GroupNorm backward crashes on the CPU when the input needs no gradient)
    got, = engine_individual_gradients(model.float(), inputs)
    torch.testing.assert_close(got, loop.float(), rtol=1e-4, atol=1e-4 * loop.abs().max().item())


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # (torch: not fused, then)
def test_an_rms_norm_wider_than_its_input_normalises_with_the_inputs_default_eps(monkeypatch):
    """``RMSNorm(eps=None)`` adds the machine epsilon of its input's (computation) dtype: a float64 layer
    on float32 inputs adds float32's (1.2e-7), which is 6% of the mean square of inputs of size 1e-3. The
    rule computes in float64 (the widest dtype) with that ε: per-sample autograd of the individual losses
    of one forward pass, within float32 rounding."""
    torch.manual_seed(0)
    model = nn.Sequential(_random_affine(nn.RMSNorm(4).double()), nn.Flatten())
    assert_matches_autograd(model, 1e-3 * torch.randn(3, 5, 4), monkeypatch)


def _global_path_uses(monkeypatch):
    """The parameter indices the engine sends to the global path, step by step."""
    from cockpit_lite.engine import global_path

    used = []
    original = global_path.serve

    def spy(state, info, indices, *args):
        used.append(sorted(indices))
        return original(state, info, indices, *args)

    monkeypatch.setattr(global_path, "serve", spy)
    return used


def assert_matches_autograd(model, x, monkeypatch, global_path=(), twin=None):
    """The engine's individual gradients of every parameter equal autograd's on the individual
    losses of one forward pass (of ``twin``, an identical model, where a forward pass changes the
    model's state), and exactly the parameters ``global_path`` (indices) take the global path."""
    used = _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(individual_reference(model if twin is None else twin, x)):
        torch.testing.assert_close(got[index], reference)
    assert used == ([sorted(global_path)] if global_path else [])


@pytest.mark.parametrize("norm", NORMS, ids=str)
def test_norm_layers_are_served_by_their_rules_not_the_global_path(norm, monkeypatch):
    make, shape = NORMS[norm]
    used = _global_path_uses(monkeypatch)
    engine_individual_gradients(nn.Sequential(make().double(), nn.Flatten()), torch.randn(3, *shape, dtype=torch.float64))
    assert not any(used), used


class HalfSamples(nn.Module):
    """A channel norm over ``[2B, C/2, L]``: its first axis is not the batch."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        b, c, length = x.shape
        return self.norm(x.reshape(2 * b, c // 2, length)).reshape(b, c, length)


class FlatTokens(nn.Module):
    """A norm over the tokens of all samples, ``[B·T, C]`` (a common idiom for BatchNorm1d)."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        b, t, c = x.shape
        return self.norm(x.reshape(b * t, c)).reshape(b, t, c)


FOLDED = {  # the samples folded into the first axis of the norm's input
    "groupnorm_half_samples": (lambda: HalfSamples(nn.GroupNorm(2, 4)), (8, 5)),
    "batchnorm_eval_half_samples": (lambda: HalfSamples(_batchnorm_eval(4)), (8, 5)),
    "layernorm_flat_tokens": (lambda: FlatTokens(nn.LayerNorm(4)), (5, 4)),
    "batchnorm_eval_flat_tokens": (lambda: FlatTokens(_batchnorm_eval(4)), (5, 4)),
}


@pytest.mark.parametrize("folded", FOLDED, ids=str)
def test_a_norm_over_folded_samples_is_left_to_the_global_path(folded, monkeypatch):
    """Its output has no axis of size B, but it is not shared by the samples: the view that
    unfolds the batch must not be taken for the broadcast of a shared tensor."""
    make, shape = FOLDED[folded]
    torch.manual_seed(0)
    model = make().double()
    _random_affine(model.norm)
    used = _global_path_uses(monkeypatch)
    assert_rule_matches_a_sample_loop(model, torch.randn(3, *shape, dtype=torch.float64))
    assert used and used[0] == [0, 1]


class Lookup(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding

    def forward(self, tokens):
        return self.embedding(tokens)


TOKENS = torch.tensor([[[1, 0, 3], [3, 3, 0]], [[2, 2, 2], [0, 0, 0]], [[4, 1, 3], [1, 4, 2]]])
"""Three samples of 2×3 tokens: repeats within a sample and across samples, and padding (0)."""


@pytest.mark.parametrize("device", problems.CPU_AND_CUDA)
@pytest.mark.parametrize("padding_idx", [None, 0], ids=str)
def test_embedding_rule_matches_a_sample_loop(padding_idx, device):
    """Rows per (sample, token), summed over a sample's repeats; padding rows stay zero (also on
    a GPU, where every tensor of the rule must be on the tokens' device)."""
    torch.manual_seed(0)
    model = Lookup(nn.Embedding(5, 3, padding_idx=padding_idx).double()).to(device)
    tokens = TOKENS.to(device)
    got = engine_individual_gradients(model, tokens)
    loop = torch.stack([torch.autograd.grad((model(tokens[n : n + 1]) ** 2).sum(), model.embedding.weight)[0] for n in range(3)])
    torch.testing.assert_close(got[0], loop)
    if padding_idx is not None:
        assert not got[0][:, padding_idx].any()


class ShiftedLookup(Lookup):
    """The looked-up rows plus 1: every position, padding included, gets a nonzero output gradient."""

    def forward(self, tokens):
        return self.embedding(tokens) + 1.0


@pytest.mark.parametrize("padding_idx", [0, 3], ids=str)
def test_the_padding_row_gets_no_gradient_where_its_positions_get_an_output_gradient(padding_idx):
    """Under ``Σ (W[idx] + 1)²`` the padding positions' output gradient is 2, not 0; autograd still
    gives the padding row no gradient, and neither may the rule (per-sample autograd of the
    individual losses of one forward pass)."""
    torch.manual_seed(0)
    model = ShiftedLookup(nn.Embedding(5, 3, padding_idx=padding_idx).double())
    tokens = TOKENS.clone()
    tokens[:, 0, 0] = padding_idx  # a padding position in every sample
    got = engine_individual_gradients(model, tokens)
    loop = individual_reference(model, tokens)[0]
    assert not loop[:, padding_idx].any() and loop.abs().sum() > 0
    torch.testing.assert_close(got[0], loop)


def test_embedding_scaled_by_frequency_is_left_to_the_global_path(monkeypatch):
    """scale_grad_by_freq divides by the token counts of the whole batch: the samples' gradients
    are coupled, and only VJPs of the individual losses of the one forward pass give them."""
    torch.manual_seed(0)
    model = Lookup(nn.Embedding(5, 3, scale_grad_by_freq=True).double())
    used = _global_path_uses(monkeypatch)
    got = engine_individual_gradients(model, TOKENS)
    torch.testing.assert_close(got[0], individual_reference(model, TOKENS)[0])
    assert used == [[0]]


class Keyword(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm(input=x)


class SamplesAsFeatures(nn.Module):
    """A Linear layer on ``[F, B]``: the samples are its input features (it mixes them)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.Linear(3, 3)

    def forward(self, x):
        return self.norm(x.reshape(3, -1).t()).t()


class SamplesAsChannels(nn.Module):
    """GroupNorm over ``[C, B, L]``: the samples are its channels (it mixes them)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(1, 3)

    def forward(self, x):
        return self.norm(x.transpose(0, 1)).transpose(0, 1)


class ConvElsewhere(nn.Module):
    """A Conv1d on ``x = [B = 3, 2, L]`` that the rule cannot read: called with a keyword, on
    the samples as its channels (``[2, B, L]``), or unbatched on ``[B, L]`` (channels = samples)."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv = nn.Conv1d(2 if how == "keyword" else 3, 3, 2)

    def forward(self, x):
        if self.how == "keyword":
            return self.conv(input=x)
        if self.how == "samples_as_channels":
            return self.conv(x.transpose(0, 1)).transpose(0, 1)
        return self.conv(x.sum(1))


UNREADABLE = {  # layers on inputs x = [B = 3, 2, 4] that their rules cannot read
    "layernorm_keyword_input": lambda: Keyword(nn.LayerNorm(4)),
    "linear_keyword_input": lambda: Keyword(nn.Linear(4, 3)),
    "groupnorm_samples_as_channels": SamplesAsChannels,
    "linear_samples_as_features": SamplesAsFeatures,
    "conv_keyword_input": lambda: ConvElsewhere("keyword"),
    "conv_samples_as_channels": lambda: ConvElsewhere("samples_as_channels"),
    "conv_unbatched": lambda: ConvElsewhere("unbatched"),
}


@pytest.mark.parametrize("case", UNREADABLE, ids=str)
def test_calls_the_rules_cannot_read_go_to_the_global_path(case, monkeypatch):
    torch.manual_seed(0)
    model = UNREADABLE[case]().double()
    if hasattr(model, "norm"):
        _random_affine(model.norm)
    assert_matches_autograd(model, torch.randn(3, 2, 4, dtype=torch.float64), monkeypatch, global_path=(0, 1))


HOOK_REPARAMETRISED = {  # a forward pre-hook computes the layer's ``weight`` from parameters of other names
    "weight_norm_linear": (lambda: nn.utils.weight_norm(nn.Linear(4, 3)), (1, 2)),  # bias, weight_g, weight_v
    "spectral_norm_linear": (lambda: nn.utils.spectral_norm(nn.Linear(4, 3)), (1,)),  # bias, weight_orig
    "weight_norm_conv": (lambda: nn.utils.weight_norm(nn.Conv1d(4, 3, 3, padding=1)), (1, 2)),
    "spectral_norm_conv": (lambda: nn.utils.spectral_norm(nn.Conv1d(4, 3, 3, padding=1)), (1,)),
}


@pytest.mark.filterwarnings("ignore::FutureWarning")  # (torch.nn.utils.weight_norm is deprecated, not gone)
@pytest.mark.parametrize("case", HOOK_REPARAMETRISED, ids=str)
def test_parameters_a_layer_rule_does_not_know_take_the_global_path(case, monkeypatch):
    """The old ``torch.nn.utils.weight_norm``/``spectral_norm``: the layer owns ``weight_g`` and ``weight_v``
    (``weight_orig``), not ``weight``. The Linear rule gave them the bias's formula (a crash of the training
    step on a shape), the convolution's failed (NaN); the bias keeps its rule, and they take the global path
    (the weight they make is no module's output, and the paths of shared tensors follow only operations
    that move or pick elements)."""
    build, unknown = HOOK_REPARAMETRISED[case]

    def built():  # (twice, not a copy: spectral_norm's pre-hook moves its vectors at every forward pass, and
        torch.manual_seed(0)  # weight_norm's module cannot be deep-copied)
        return nn.Sequential(build().double(), nn.Tanh(), nn.Flatten())

    model, twin = built(), built()
    x = torch.randn(5, 4, dtype=torch.float64) if "linear" in case else torch.randn(5, 4, 6, dtype=torch.float64)
    assert_matches_autograd(model, x, monkeypatch, global_path=unknown, twin=twin)


def _bfloat16_reference(layer, x, per_sample):
    """The layer's individual gradients from its bf16 output gradient, in float64."""
    captured = {}
    def keep(module, args, out):  # the last backward pass's: the user's (the engine's own passes come first)
        out.register_hook(lambda g: captured.__setitem__("delta", g))

    handle = layer.register_forward_hook(keep)
    got = engine_individual_gradients(nn.Sequential(layer), x, wide=True)
    handle.remove()
    return got, per_sample(captured["delta"].double())


class Projected(nn.Module):
    """``(x @ basis) ⊙ w`` with ``basis`` an argument without a batch axis (the generic rule keeps it
    as a constant of the re-run)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x, basis):
        return (x @ basis) * self.w


class WithBasis(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Projected()
        self.register_buffer("basis", torch.randn(4, 4))

    def forward(self, x):
        return self.inner(x, self.basis)


def test_a_bfloat16_layers_shared_tensor_argument_is_cast_with_its_inputs():
    """The generic rule re-runs a bf16 layer in float32: a tensor argument shared by the samples is
    cast with the batched input (a bf16 basis would meet a float32 input in ``x @ basis``)."""
    torch.manual_seed(0)
    model, x = WithBasis().bfloat16(), torch.randn(3, 4).bfloat16()
    projected = x.double() @ model.basis.double()
    got, reference = _bfloat16_reference(model, x, lambda d: d * projected)
    torch.testing.assert_close(got[0].double(), reference, rtol=1e-3, atol=1e-3)


def test_bfloat16_layers_accumulate_in_float32():
    """bf16 in, bf16 output gradients: the rules sum in float32 (bf16 sums are ~1e-2 off)."""
    torch.manual_seed(0)
    norm = _random_affine(nn.LayerNorm(64)).bfloat16()
    x = torch.randn(3, 40, 64).bfloat16()
    xd = x.double()
    x_hat = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + norm.eps)
    got, reference = _bfloat16_reference(norm, x, lambda d: (d * x_hat).sum(1))
    torch.testing.assert_close(got[0].double(), reference, rtol=1e-3, atol=1e-3)

    linear = nn.Linear(64, 8).bfloat16()
    got, reference = _bfloat16_reference(linear, x, lambda d: torch.einsum("nlo,nli->noi", d, xd))
    torch.testing.assert_close(got[0].double(), reference, rtol=1e-3, atol=1e-3)

    embedding = nn.Embedding(4, 8).bfloat16()
    tokens = torch.randint(0, 4, (3, 12))
    got, reference = _bfloat16_reference(
        embedding, tokens, lambda d: torch.zeros(3, 4, 8, dtype=torch.float64).index_put_(
            (torch.arange(3)[:, None].expand(3, 12), tokens), d, accumulate=True)
    )
    torch.testing.assert_close(got[0].double(), reference, rtol=1e-3, atol=1e-3)


def _bfloat16_batch_norm_eval():
    layer = nn.BatchNorm2d(4)
    layer.running_mean.uniform_(-1, 1)
    layer.running_var.uniform_(0.5, 2)
    return layer.eval()


def _standardised(x, axis, eps):
    """``(x − mean) / sqrt(var + eps)`` over the last axis of ``x`` reshaped to ``[..., axis]``."""
    g = x.reshape(*x.shape[:-1], axis) if axis else x
    return (g - g.mean(-1, keepdim=True)) / torch.sqrt(g.var(-1, unbiased=False, keepdim=True) + eps)


BFLOAT16_LAYERS = {  # layer on x = [3, 4, 6, 5], and x̂ in float64 (None: a convolution)
    "conv": (lambda: nn.Conv2d(4, 3, 3, padding=1), None),
    "groupnorm": (lambda: nn.GroupNorm(2, 4), lambda x, layer: _standardised(
        x.reshape(3, 2, -1), 0, layer.eps).reshape(x.shape)),
    "batchnorm_eval": (_bfloat16_batch_norm_eval, lambda x, layer: (x - layer.running_mean.double()[:, None, None])
                       / torch.sqrt(layer.running_var.double()[:, None, None] + layer.eps)),
    "layernorm": (lambda: nn.LayerNorm(5), lambda x, layer: _standardised(x, 0, layer.eps)),
}


@pytest.mark.parametrize("name", BFLOAT16_LAYERS, ids=str)
def test_bfloat16_convolutions_and_norms_accumulate_in_float32(name):
    """bf16 inputs, parameters and output gradients: the weight's and the bias's individual
    gradients are summed in float32 (within float32 rounding of the float64 sums of the same
    bf16 operands; bf16 sums are ~1e-2 off)."""
    make, normalised = BFLOAT16_LAYERS[name]
    torch.manual_seed(0)
    layer = _random_affine(make()).bfloat16()
    x = torch.randn(3, 4, 6, 5).bfloat16()
    (weight, bias), delta = _bfloat16_reference(layer, x, lambda d: d)
    positions = (1, 2) if name == "layernorm" else (2, 3)  # the axes each parameter entry is broadcast along
    if normalised is None:
        wide = layer.double()
        reference = torch.stack([torch.autograd.grad(wide(x[n : n + 1].double()), wide.weight, delta[n : n + 1])[0]
                                 for n in range(3)])
    else:
        reference = (delta * normalised(x.double(), layer)).sum(positions)
    torch.testing.assert_close(weight.double(), reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(bias.double(), delta.sum(positions), rtol=1e-4, atol=1e-4)


def test_bfloat16_attention_accumulates_in_float32(monkeypatch):
    """The projections read from the graph (rules/attention.py) in bf16: the output projection's
    bias gradient of each sample, ``Σ_t δ_t``, summed in float32."""
    torch.manual_seed(0)
    model = SelfAttention(True).bfloat16()
    served = _attention_served(monkeypatch)
    got, delta = _bfloat16_reference(model, torch.randn(3, 40, 6).bfloat16(), lambda d: d)
    torch.testing.assert_close(got[3].double(), delta.sum(1), rtol=1e-4, atol=1e-4)
    assert served == [["in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"]]


class Guarded(nn.Module):
    """A custom layer with a NaN guard: data-dependent control flow, which ``vmap`` cannot run;
    and a parameter its forward does not use."""

    def __init__(self):
        super().__init__()
        self.w, self.spare = nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(4))

    def forward(self, x):
        if torch.isnan(x).any():
            raise ValueError("NaN input")
        return torch.tanh(x * self.w)


def test_a_layer_vmap_cannot_run_is_re_run_one_sample_at_a_time(monkeypatch):
    """vmap is tried once: the second step knows to loop at once."""
    from cockpit_lite.engine.rules import GENERIC, generic

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), Guarded(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    used = _global_path_uses(monkeypatch)
    monkeypatch.setattr(GENERIC, "_loop", generic.GenericRule()._loop)  # a new rule's memory: none from other tests
    tried, vmap = [], generic.vmap
    monkeypatch.setattr(generic, "vmap", lambda *args, **kwargs: tried.append(1) or vmap(*args, **kwargs))
    for step in range(2):
        model.zero_grad()
        tried.clear()
        got = engine_individual_gradients(model, x)
        for index, reference in enumerate(individual_reference(model, x)):
            torch.testing.assert_close(got[index], reference)
        assert len(tried) == (1 if step == 0 else 0), (step, tried)
    assert used == []


def slow_spectral_norm(size):
    """``spectral_norm`` of a ``size × size`` Linear layer whose two largest singular values are 1 and 0.97:
    its power iteration converges slowly, so each call moves its vectors visibly."""
    layer = nn.Linear(size, size)
    left, _ = torch.linalg.qr(torch.randn(size, size))
    right, _ = torch.linalg.qr(torch.randn(size, size))
    values = torch.tensor([1.0, 0.97] + [0.5] * (size - 2))
    with torch.no_grad():
        layer.weight.copy_(left @ torch.diag(values) @ right.T)
    return nn.utils.parametrizations.spectral_norm(layer)


class TwiceSpectral(nn.Module):
    """A ``spectral_norm`` layer applied twice in one forward pass: its power iteration runs at each call."""

    def __init__(self):
        super().__init__()
        self.layer = slow_spectral_norm(4)

    def forward(self, x):
        return self.layer(torch.tanh(self.layer(x)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_a_layer_whose_forward_pass_updates_its_buffers_is_re_run_from_those_it_began_with(dtype, monkeypatch):
    """``spectral_norm``'s power iteration moves its vectors in training mode at every call, before it
    uses them; a re-run from their values after the call is off by about 3e-4 (relative), which the check
    against autograd lets pass in float32. The first step takes the global path; from the next, every
    call is re-run from copies of the vectors as it found them. Against float64 autograd on a copy of
    the model taken before the step (whose forward pass moves its own vectors the same way)."""
    torch.manual_seed(0)
    model = nn.Sequential(slow_spectral_norm(4), nn.Tanh(), TwiceSpectral(), nn.Linear(4, 2)).to(dtype)
    params = list(model.parameters())
    engine = Engine(model, params, [str(i) for i in range(len(params))])
    used = _global_path_uses(monkeypatch)
    for step in range(3):
        x = torch.randn(5, 4, dtype=dtype)
        reference = individual_reference(copy.deepcopy(model).double(), x.double())
        individual = (model(x) ** 2).sum(1)
        info = StepInfo({"loss": individual.sum(), "individual_losses": individual}, step,
                        batch_size=engine.batch_size(), model=model)
        engine.begin([Keep()], info, info.batch_size, [None] * len(params), ["Test"])
        individual.sum().backward()
        results, _, flags = engine.finish()
        engine.forget()
        assert not flags, flags
        for index, expected in enumerate(reference):
            got = results[index]["keep"].double()
            scale = expected.abs().max().item()
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=(1e-12 if dtype is torch.float64 else 1e-5) * scale)
        model.zero_grad()
    spectral = [1, 3]  # the two parametrised weights' ``original`` (indices in ``model.parameters()``)
    assert used == [spectral], used  # TwiceSpectral's bias (its two uses) by a path from the parameter


class Recurrent(nn.Module):
    """An RNN given its initial state ``hx``, read out through its outputs and final state
    (the output is ``[B, H]`` whatever the layout)."""

    def __init__(self, kind, batch_first, layers=1):
        super().__init__()
        self.rnn = getattr(nn, kind)(3, 4, num_layers=layers, batch_first=batch_first)
        self.kind = kind

    def forward(self, x):
        batch = x.shape[0 if self.rnn.batch_first else 1]
        h0 = torch.full((self.rnn.num_layers, batch, 4), 0.1, dtype=x.dtype)
        hx = (h0, torch.full_like(h0, -0.2)) if self.kind == "LSTM" else h0
        out, state = self.rnn(x, hx)
        h_n = state[0] if self.kind == "LSTM" else state
        return out.sum(1 if self.rnn.batch_first else 0) + 2 * h_n[-1]


class Attending(nn.Module):
    """Cross-attention (the generic rule) with masks, optionally read out through its weights."""

    def __init__(self, batch_first, mask, weights=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(6, 2, batch_first=batch_first)
        self.mask, self.weights = mask, weights

    def forward(self, x):
        batch_first = self.attn.batch_first
        b, t = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
        kwargs = {}
        if self.mask == "key_padding":
            padding = torch.zeros(b, t, dtype=torch.bool)
            padding[0, -1] = True
            kwargs["key_padding_mask"] = padding
        elif self.mask == "causal":
            kwargs["attn_mask"] = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        elif self.mask == "causal_and_key_padding":  # the shared mask first: the per-sample one still counts
            kwargs["attn_mask"] = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
            kwargs["key_padding_mask"] = torch.zeros(b, t, dtype=torch.bool)
            kwargs["key_padding_mask"][1, -1] = True
        elif self.mask == "per_head":
            kwargs["attn_mask"] = torch.zeros(b * 2, t, t)
        out, weights = self.attn(x, torch.tanh(x), torch.tanh(x), need_weights=self.weights, **kwargs)
        out = out.sum(1 if batch_first else 0)
        return out + weights.sum((1, 2)).unsqueeze(1) if self.weights else out


class Scaled(nn.Module):
    """A custom layer taking a shared tensor by keyword."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x, scale=None):
        return torch.tanh(x * self.w) * scale


class WithScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.scaled = nn.Linear(3, 4), Scaled()

    def forward(self, x):
        return self.scaled(self.lin(x), scale=torch.linspace(0.5, 2, 4, dtype=x.dtype))


class Variadic(nn.Module):
    """A custom layer whose forward takes its inputs as ``*inputs`` (more than its signature names)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, *inputs):
        return torch.tanh(inputs[0] * self.w) + inputs[1]


class WithVariadic(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.variadic = nn.Linear(3, 4), Variadic()

    def forward(self, x):
        h = self.lin(x)
        return self.variadic(h, torch.sin(h))


class Unsigned(nn.Module):
    """A custom layer whose forward's signature cannot be read (as a compiled extension's): its arguments
    are named by position."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return torch.tanh(x * self.w)

    forward.__signature__ = "compiled"  # inspect.signature raises a TypeError


class DropoutInside(nn.Module):
    """A custom layer with a ``dropout`` attribute (the generic rule cannot re-run it when > 0)."""

    def __init__(self, p):
        super().__init__()
        self.dropout, self.w = p, nn.Parameter(torch.randn(3))

    def forward(self, x):
        return torch.tanh(nn.functional.dropout(x * self.w, self.dropout, self.training))


GENERIC_CASES = {  # name: (model, sequence-first input, served by the generic rule)
    "lstm_batch_first": (lambda: Recurrent("LSTM", True), False, True),
    "lstm_sequence_first": (lambda: Recurrent("LSTM", False), True, True),
    "gru_sequence_first": (lambda: Recurrent("GRU", False), True, True),
    "rnn_batch_first": (lambda: Recurrent("RNN", True), False, True),
    "attention_key_padding_mask": (lambda: Attending(True, "key_padding"), False, True),
    "attention_sequence_first_causal_mask": (lambda: Attending(False, "causal"), True, True),
    "attention_causal_and_key_padding_masks": (lambda: Attending(True, "causal_and_key_padding"), False, True),
    "attention_weights_read_out": (lambda: Attending(True, None, weights=True), False, True),
    "attention_sequence_first_weights": (lambda: Attending(False, "key_padding", weights=True), True, True),
    "attention_per_head_mask": (lambda: Attending(True, "per_head"), False, False),  # mixes batch and heads
    "keyword_tensor_shared_by_the_samples": (WithScale, False, True),
    "variadic_forward": (WithVariadic, False, True),
    "forward_without_a_signature": (Unsigned, False, True),
    "dropout_attribute_zero": (lambda: DropoutInside(0.0), False, True),
    "dropout_attribute_in_eval_mode": (lambda: DropoutInside(0.5).eval(), False, True),
    "dropout_inside": (lambda: DropoutInside(0.5), False, False),
    # an axis other than the batch's as long as the batch: only the layout tells them apart
    "gru_sequence_first_as_long_as_the_batch": (lambda: Recurrent("GRU", False), True, True),
    "lstm_as_many_layers_as_samples": (lambda: Recurrent("LSTM", True, layers=3), False, True),
    "attention_sequence_first_as_long_as_the_batch": (lambda: Attending(False, "key_padding", weights=True), True, True),
}


@pytest.mark.parametrize("case", GENERIC_CASES, ids=str)
def test_the_generic_rule_serves_recurrent_attention_and_custom_layers(case, monkeypatch):
    """Served by the generic rule (sequence-first inputs pass ``batch_size`` and no individual
    losses, so the global path could not even run), or sent to the exact global path."""
    make, sequence_first, served = GENERIC_CASES[case]
    torch.manual_seed(0)
    model = make().double()
    b, t, f = 3, (3 if "as_long_as" in case else 4), (6 if "attention" in case else 3)
    x = torch.randn(t, b, f, dtype=torch.float64) if sequence_first else torch.randn(b, t, f, dtype=torch.float64)
    if case in ("keyword_tensor_shared_by_the_samples", "variadic_forward", "forward_without_a_signature") or \
            case.startswith("dropout"):
        x = x[:, 0]
    used = _global_path_uses(monkeypatch)
    torch.manual_seed(1)
    got = engine_individual_gradients(model, x, batch_size=b if sequence_first else None)
    torch.manual_seed(1)
    for index, expected in enumerate(_reference_over_output_samples(model, x)):
        torch.testing.assert_close(got[index], expected)
    n = sum(p.requires_grad for p in model.parameters())
    assert used == ([] if served else [list(range(n))])


class WithPenalty(nn.Module):
    """A custom layer returning its output and a term of its parameter alone (no batch axis)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.tanh(x * self.w), self.w.square()


class Penalised(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.layer = nn.Linear(3, 4), WithPenalty()

    def forward(self, x):
        y, penalty = self.layer(self.lin(x))
        return y + penalty


def test_a_custom_layer_with_an_output_without_a_batch_axis_takes_the_global_path(monkeypatch):
    """Its second output has no axis of the batch's size: the generic rule cannot read it, so the
    layer's parameter takes the exact global path and the Linear before it keeps its rule (per-sample
    autograd of the individual losses of one forward pass)."""
    torch.manual_seed(0)
    assert_matches_autograd(Penalised().double(), torch.randn(5, 3, dtype=torch.float64), monkeypatch, global_path=(2,))


def _reference_over_output_samples(model, x):
    """``individual_reference`` for a model whose output is ``[B, ...]`` whatever its input's layout."""
    out = model(x)
    individual = (out**2).reshape(out.shape[0], -1).sum(1)
    return [torch.stack([_grad(individual[n], p) for n in range(out.shape[0])]) for p in model.parameters() if p.requires_grad]


class Averaging(nn.Module):
    """A custom layer keeping a running mean of its inputs in a buffer (updated in its forward)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x):
        if self.training:
            self.running.mul_(0.9).add_(0.1 * x.detach().mean(0))
        return torch.tanh(x * self.w)


class GuardedDropout(Guarded):
    """Dropout by a function call (no ``dropout`` attribute) after a NaN guard: ``vmap`` fails on the
    guard first, so the samples are re-run one at a time."""

    def forward(self, x):
        return nn.functional.dropout(super().forward(x), 0.3, self.training)


def _step_state(layer, device, observed, batch_size=5):
    """Parameters, buffers and the random state after two SGD steps of a model around ``layer``
    (in training mode), with the engine's individual gradients (``observed``) or without."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), layer(), nn.Linear(4, 2)).double().to(device)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    engine = Engine(model, params, [str(i) for i in range(len(params))]) if observed else None
    for step in range(2):
        x = torch.randn(batch_size, 3, dtype=torch.float64, device=device)
        out = model(x)
        individual = (out**2).sum(1)
        loss = individual.sum()
        opt.zero_grad()
        if observed:
            info = StepInfo({"loss": loss, "individual_losses": individual}, step, batch_size=batch_size, model=model)
            engine.begin([Keep()], info, info.batch_size, [None] * len(params), ["Test"])
            loss.backward()
            engine.finish()
        else:
            loss.backward()
        opt.step()
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())], problems.random_states(device)


@pytest.mark.parametrize("device", problems.CPU_AND_CUDA)
@pytest.mark.parametrize(
    "layer", [Averaging, GuardedDropout], ids=["buffer_updated_in_forward", "dropout_after_a_guard"]
)
def test_the_generic_re_run_leaves_buffers_and_the_random_state_alone(layer, device):
    """The re-run updates clones of the module's buffers and draws from a forked random state
    (CPU and the module's GPU): parameters, buffers and the random state after training are bit
    for bit those without the engine."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropout layer is flagged, then sent to the global path
        observed, observed_states = _step_state(layer, device, True)
    plain, plain_states = _step_state(layer, device, False)
    assert all(torch.equal(a, b) for a, b in zip(plain, observed))
    assert all(torch.equal(a, b) for a, b in zip(plain_states, observed_states))


@pytest.mark.parametrize("batch_size", [5, 1])
def test_a_re_run_that_draws_random_numbers_is_left_to_the_global_path(batch_size, monkeypatch):
    """Detected at the first sample of the loop (the random state moved; also when it is the only
    one), flagged, and served by the exact global path from the next step on (its ``w``; its unused
    ``spare`` has zeros without a backward pass)."""
    used = _global_path_uses(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step_state(GuardedDropout, "cpu", True, batch_size)
    assert any("GuardedDropout draws random numbers (dropout)" in str(w.message) for w in caught)
    assert used == [[2]]


class SharedBlock(nn.Module):
    """One block registered and applied three times (ALBERT-style ``ModuleList([block] * 3)``)."""

    def __init__(self):
        super().__init__()
        block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Tanh())
        self.layers = nn.ModuleList([block] * 3)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_a_block_registered_several_times_sums_its_uses(monkeypatch):
    """Each of its calls is one use (it crashed the user's backward pass: every registration
    counted its parameters again)."""
    torch.manual_seed(0)
    assert_matches_autograd(SharedBlock().double(), torch.randn(5, 4, dtype=torch.float64), monkeypatch)


def test_the_generic_rule_on_a_float32_model_keeps_float32_precision(monkeypatch):
    """The re-run runs without autocast (a bf16 re-run would be 1e-2 off): within float32
    rounding of a float64 reference."""
    torch.manual_seed(0)
    model = Recurrent("LSTM", True)
    x = torch.randn(3, 4, 3)
    got = engine_individual_gradients(model, x)
    for index, reference in enumerate(_reference_over_output_samples(model.double(), x.double())):
        torch.testing.assert_close(got[index].double(), reference, rtol=1e-4, atol=1e-5)


class Matmul(nn.Module):
    """A custom layer (the generic rule) whose matrix product autocast runs in bf16: ``tanh(x W)``."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return torch.tanh(x @ self.w)


@pytest.mark.parametrize("device", problems.CPU_AND_CUDA)
def test_the_generic_re_run_runs_without_the_users_autocast(device):
    """Forward and backward inside ``torch.autocast(device, bfloat16)``: the re-run turns autocast off on the
    device the layer runs on, so its individual gradients are float32's, ``x_nᵀ (δ_n ⊙ (1 − tanh²(x_n W)))`` with
    the output gradient ``δ`` of that backward pass, against float64 to 1e-4 (a bf16 re-run is about 1e-2 off)."""
    torch.manual_seed(0)
    layer, x = Matmul().to(device), torch.randn(6, 4, device=device)
    deltas, hooked = [], []

    def keep_output_grad(module, args, out):
        if not deltas and not hooked:  # the user's forward pass (not the engine's re-run)
            hooked.append(out.register_hook(deltas.append))

    layer.register_forward_hook(keep_output_grad)
    with torch.autocast(device, dtype=torch.bfloat16):
        (got,) = engine_individual_gradients(layer, x)
    (delta,) = deltas
    x64, w64 = x.double(), layer.w.detach().double()
    reference = x64[:, :, None] * (delta.double() * (1 - torch.tanh(x64 @ w64) ** 2))[:, None, :]
    torch.testing.assert_close(got.double(), reference, rtol=1e-4, atol=1e-6)


class Elementwise(nn.Module):
    """A custom layer (the generic rule): ``tanh(x · w)``, elementwise (promoting mixed dtypes)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.tanh(x * self.w)


@pytest.mark.parametrize("parameters, inputs", [(torch.float32, torch.float64), (torch.float64, torch.float32)],
                         ids=["float32_parameters", "float32_inputs"])
def test_the_generic_rule_re_runs_in_the_widest_dtype_of_its_inputs_and_parameters(parameters, inputs):
    """Parameters and inputs of different dtypes, which the layer's arithmetic promotes to float64:
    its re-run is in float64 too, within float64 rounding of the same layer and inputs in float64."""
    torch.manual_seed(0)
    layer, x = Elementwise().to(parameters), torch.randn(5, 4, dtype=inputs)
    got, = engine_individual_gradients(layer, x)
    reference, = individual_reference(copy.deepcopy(layer).double(), x.double())
    torch.testing.assert_close(got, reference, rtol=1e-12, atol=1e-14)


class Fourier(nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x)


class Magnitude(nn.Module):
    """A custom layer on a complex input (a spectrum), ``|z · w|`` with a real ``w``."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, z):
        return (z * self.w).abs()


def test_a_complex_input_leaves_the_generic_rules_dtype_real(monkeypatch):
    """The re-run's dtype is the widest floating dtype of the inputs and parameters: a complex input
    (the spectrum of an FFT) is passed as it is, and the real weight's individual gradients stay real
    and equal autograd's on the individual losses of one forward pass (served by the rule, not the
    global path)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), Fourier(), Magnitude()).double()
    assert_matches_autograd(model, torch.randn(5, 3, dtype=torch.float64), monkeypatch)


def test_layers_before_an_evaluating_batch_norm_are_served_by_their_rules(monkeypatch):
    """BatchNorm in evaluation mode uses its running statistics: it does not mix the samples."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 2)).double()
    model[1].running_mean.uniform_(-1, 1)
    model.eval()
    assert_matches_autograd(model, torch.randn(6, 4, dtype=torch.float64), monkeypatch)


class Seen(Keep):
    """``Keep``, recording the parameter index and ``B`` each parameter's individual gradients come with."""

    def __init__(self):
        self.seen = []

    def __call__(self, per_sample):
        self.seen.append((per_sample.index, per_sample.batch_size))
        return super().__call__(per_sample)


@pytest.mark.parametrize("order", [1, -1], ids=["weight_first", "bias_first"])
def test_a_subsampled_convolution_forms_the_drawn_samples_individual_gradients(order):
    """At a subsampled step the convolution's weight and bias get the drawn samples' individual
    gradients (autograd's, one forward pass), each with its parameter's index and the batch's ``B``,
    whichever the Cockpit lists first (an optimizer's groups may put the biases first)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten()).double()
    x, rows, seen = torch.randn(5, 2, 5, 5, dtype=torch.float64), torch.tensor([1, 3]), Seen()
    got = engine_individual_gradients(model, x, subset=rows, keep=seen, params=list(model.parameters())[::order])
    for index, reference in enumerate(individual_reference(model, x)[::order]):
        torch.testing.assert_close(got[index], reference[rows])
    assert sorted(seen.seen) == [(0, 5), (1, 5)]


def test_a_subsampled_convolutions_check_is_its_weight_gradient_on_random_output_channels():
    """``_channels_check``: ``value = project(G)`` for the batch's weight gradient ``G`` (autograd's,
    float64), and for ``G − E`` the distance estimates ``‖E‖`` (mean square ``‖E‖²`` over many draws
    of the channels)."""
    from cockpit_lite.engine.rules import conv

    torch.manual_seed(0)
    layer = nn.Conv2d(3, 6, kernel_size=3, padding=1).double()
    x = torch.randn(4, 3, 7, 6, dtype=torch.float64)
    out = layer(x)
    delta = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, layer.weight, delta)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        value, project = conv._channels_check(layer, x, delta, layer.weight, generator)
        torch.testing.assert_close(value, project(grad))
        error = torch.randn(grad.shape, dtype=torch.float64)
        squares = torch.tensor([
            float(((value - project(grad - error)) ** 2).sum())
            for value, project in (conv._channels_check(layer, x, delta, layer.weight, generator) for _ in range(3000))
        ])
    mean, se = float(squares.mean()), float(squares.std() / len(squares) ** 0.5)
    assert abs(mean - float(error.norm()) ** 2) < 4 * se, (mean, float(error.norm()) ** 2, se)


def test_a_subsampled_convolution_is_checked_on_two_output_channels_a_grouped_one_whole(monkeypatch):
    """At a subsampled step a plain convolution's individual gradients are checked against
    autograd's gradient on ``CHECKED_CHANNELS`` random output channels (its whole weight gradient
    is never formed; the channels drawn by the Cockpit's own generator, the user's random state
    untouched), a grouped one's on its whole gradient; an honest run has no flag."""
    from cockpit_lite import Cockpit, quantities
    from cockpit_lite.engine.rules import conv

    formed = []  # (groups, output channels) of every weight gradient formed for the whole batch
    weight_grads = conv._weight_grads

    def spy(module, inputs, delta, param, stacked=True):
        if not stacked:
            formed.append((module.groups, param.shape[0]))
        return weight_grads(module, inputs, delta, param, stacked)

    monkeypatch.setattr(conv, "_weight_grads", spy)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 6, 3), nn.Tanh(), nn.Conv2d(6, 4, 3, groups=2), nn.Flatten(), nn.Linear(16, 3))
    x, y = torch.randn(8, 2, 6, 6), torch.randint(0, 3, (8,))
    cp = Cockpit(model.double(), [quantities.NormTest()], diagnose=False, samples=3)
    random_state = torch.random.get_rng_state()
    for step in range(2):
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(x.double()), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
        assert "flags" not in cp.get_output()[step], cp.get_output()[step]
    assert sorted(set(formed)) == [(1, conv.CHECKED_CHANNELS), (2, 4)], formed
    assert torch.equal(torch.random.get_rng_state(), random_state)


class _BatchNormAct2d(nn.BatchNorm2d):
    """timm's ``BatchNormAct2d`` in small: a BatchNorm2d subclass with its activation inside ``forward``."""

    def forward(self, x):
        return torch.relu(super().forward(x))


@pytest.mark.parametrize("size", [3, 1])  # also EfficientNet's head on a 1×1 map
def test_a_batchnorm_subclass_in_training_mode_takes_the_global_path(size, monkeypatch):
    """No layer rule knows the subclass, and the generic rule runs one sample alone, with its own statistics
    instead of the batch's: its weight and bias were 0.3 away from autograd's gradient (NaN with a flag, then
    the global path from the next step), and on a 1×1 map the call failed ("Expected more than 1 value per
    channel"). A module that mixes the samples is never served sample by sample: the global path at once."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), _BatchNormAct2d(4), nn.Flatten(),
                          nn.Linear(4 * size * size, 3)).double()
    assert_matches_autograd(model, torch.randn(4, 2, size, size, dtype=torch.float64), monkeypatch,
                            global_path=[0, 1, 2, 3])


class _BilinearHead(nn.Module):
    """``nn.Bilinear`` of a feature with itself: the generic rule, whose vmap runs aten::_trilinear in a loop."""

    def __init__(self):
        super().__init__()
        self.first, self.pair = nn.Linear(4, 3), nn.Bilinear(3, 3, 2)

    def forward(self, x):
        h = torch.tanh(self.first(x))
        return self.pair(h, h)


def test_the_generic_rules_vmap_fallback_warns_the_user_of_nothing(monkeypatch):
    """torch.func warned "There is a performance drop because we have not yet implemented the batching rule
    for aten::_trilinear ... Please file us an issue" at every tracked step of a model with nn.Bilinear (also
    an LSTM's mkldnn kernel, nn.EmbeddingBag): the engine's own vmap, nothing the user can act on. Silenced
    inside the rule only; the individual gradients stay exact."""
    import warnings

    torch.manual_seed(0)
    model = _BilinearHead().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_matches_autograd(model, x, monkeypatch)
    assert not [w for w in caught if "batching rule" in str(w.message)], [str(w.message)[:80] for w in caught]
    with warnings.catch_warnings(record=True) as caught:  # the user's own vmap still warns
        warnings.simplefilter("always")
        torch.func.vmap(lambda a: model.pair(a, a))(torch.randn(2, 1, 3, dtype=torch.float64))
    assert [w for w in caught if "batching rule" in str(w.message)]


def test_rerunning_is_said_inside_the_engines_rerun_only():
    """``rerunning()`` (read by the signals' forward hooks): inside ``rerun()``, nested or not, and
    not outside it."""
    from cockpit_lite.engine.rules.base import rerun, rerunning

    assert not rerunning()
    with rerun():
        assert rerunning()
        with rerun():
            assert rerunning()
        assert rerunning()
    assert not rerunning()



class Gated(nn.Module):
    """A custom layer whose weight a forward pre-hook forms from ``g`` and ``v`` at every call (as
    ``weight_norm`` does)."""

    def __init__(self):
        super().__init__()
        self.g, self.v = nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(4))
        self.register_forward_pre_hook(lambda module, args: setattr(module, "weight", module.g * module.v))

    def forward(self, x):
        return torch.tanh(x * self.weight)


def test_a_layer_whose_forward_pre_hook_forms_its_weight_is_re_run_with_its_hooks(monkeypatch):
    """The generic rule's re-run calls the module (its hooks run: the weight is formed from the
    re-run's parameters), not only its ``forward``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), Gated(), nn.Linear(4, 2)).double()
    assert_matches_autograd(model, torch.randn(5, 3, dtype=torch.float64), monkeypatch)


def test_a_custom_layer_sharded_by_fsdp2_is_re_run_with_the_gathered_parameters(one_rank, monkeypatch):
    """A custom layer ``fully_shard``-ed on its own (FSDP2, one rank) is re-run by its ``forward``, without
    the hooks that would all-gather and put FSDP's own parameters in place of the re-run's, with its
    keyword argument: the individual gradients of the same model unsharded (per-sample autograd of the
    individual losses of one forward pass)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = WithScale().double()
    plain = copy.deepcopy(model)
    fully_shard(model.scaled)
    fully_shard(model)
    assert_matches_autograd(model, torch.randn(5, 3, dtype=torch.float64), monkeypatch, twin=plain)


class RowAttention(nn.Module):
    """A MultiheadAttention given a batch ``[B, E]`` as its unbatched query ``[T, E]``: the rows, read as
    the samples, attend to each other."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.attn = nn.MultiheadAttention(6, 2, batch_first=True)

    def forward(self, x):
        h = self.inp(x)
        return self.attn(h, h, h)[0]


def test_an_attention_over_the_rows_of_the_batch_mixes_the_samples(monkeypatch):
    """Its own parameters and the layer before it take the global path (before: the attention planner read
    the rows as samples, and the check against autograd blamed a penalty on the loss)."""
    assert_matches_autograd(RowAttention().double(), torch.randn(5, 4, dtype=torch.float64), monkeypatch,
                            global_path=range(6))
