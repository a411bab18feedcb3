"""Business and full on many set-ups: every recorded value against a brute force, float64.

Usage::

    python -m experiments.curvature_setups [--only NAME ...] [--steps 4] [--json PATH]

Each set-up is a model, a loss, an optimizer and a recipe detail (norm clipping, bf16 autocast,
gradient accumulation, activation checkpointing, a BackPACK-extended model); it trains ``--steps``
steps (float64, batch 4; bf16 autocast in float32) with a Cockpit of ``configuration(level,
extras=True)``, ``diagnose=False``, for three columns: ``business`` and ``full`` with the default
``curvature="auto"``, and ``business`` with ``curvature="diag_ggn_exact"``. Every value of every
step whose next step exists (α needs it) is compared with a brute force from the step's snapshot
(``tests/problems.py``: individual gradients by a loop of ``torch.autograd.grad`` over the
samples' terms of one forward pass, the Hessian by autograd, the GGN ``Jᵀ (∇²_f L) J``) through
the reference functions of the quantities' own tests:

- ``exact``: relative error ≤ 1e-7 (float64; ``HessMaxEV``: the eigensolver's 1e-3); bf16 autocast
  against the brute force of the same autocast forward (the curvature: of the float64 model) within
  5e-2 (bf16's rounding, 2⁻⁸, amplified where a statistic cancels);
- ``est.``: an estimate (Hutchinson's ``HessTrace``, the record says so) within 4 of its standard
  errors of the exact value, total and per layer;
- ``refused``: NaN with a flag naming why (counted with its reason);
- ``WRONG``: anything else (a value off, or NaN without a flag).

A set-up's cell is the worst of its values' outcomes (``WRONG`` < ``refused`` < ``est.`` <
``exact``), with notes; a single tensor's value that is NaN because its statistic is rounding
noise (flagged: a gradient zero up to rounding, such as an attention key bias or a bias before a
BatchNorm, or a spread lost in rounding; its brute force is noise as well) leaves it ``exact``,
noted. The histograms are left out (tested against ``numpy`` on their own).
"""

import argparse
import copy
import functools
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "quantities")]
# the brute-force references of the test suite, one definition each (this script runs in a clone)
import models  # noqa: E402
import problems  # noqa: E402
import test_alpha  # noqa: E402
import test_grad_norm  # noqa: E402
import test_grad_variance  # noqa: E402
import test_hess_max_ev  # noqa: E402
import test_inner_test  # noqa: E402
import test_loss  # noqa: E402
import test_mean_gsnr  # noqa: E402
import test_norm_test  # noqa: E402
import test_ortho_test  # noqa: E402
import test_tic_defaults  # noqa: E402

from cockpit_lite import Cockpit, configuration, extend  # noqa: E402


# -- held-out architectures (beside the test suite's tests/models.py) ------------------------------

class ConvNeXtBlock(nn.Module):
    """Depthwise 3×3 conv, LayerNorm over channels (channels last), pointwise MLP with GELU, layer scale."""

    def __init__(self, c=4):
        super().__init__()
        self.stem = nn.Conv2d(2, c, 2, stride=2)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.norm = nn.LayerNorm(c)
        self.up, self.down = nn.Linear(c, 2 * c), nn.Linear(2 * c, c)
        self.gamma = nn.Parameter(0.5 * torch.ones(c))
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        x = self.stem(x)
        h = self.dw(x).permute(0, 2, 3, 1)
        h = self.down(F.gelu(self.up(self.norm(h)))) * self.gamma
        return self.head((x + h.permute(0, 3, 1, 2)).mean((2, 3)))


class SqueezeExcite(nn.Module):
    def __init__(self, c, gate):
        super().__init__()
        self.reduce, self.expand, self.gate = nn.Conv2d(c, 2, 1), nn.Conv2d(2, c, 1), gate

    def forward(self, x):
        return x * self.gate(self.expand(F.silu(self.reduce(x.mean((2, 3), keepdim=True)))))


class MobileBlock(nn.Module):
    """Depthwise-separable conv with BatchNorm, an activation, a squeeze-excite gate (EfficientNet:
    SiLU and sigmoid; MobileNetV3: hardswish and hardsigmoid, which has no second derivative)."""

    def __init__(self, activation, gate, c=4):
        super().__init__()
        self.expand, self.bn1 = nn.Conv2d(2, c, 1, bias=False), nn.BatchNorm2d(c)
        self.dw, self.bn2 = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.BatchNorm2d(c)
        self.se, self.activation = SqueezeExcite(c, gate), activation
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        h = self.activation(self.bn1(self.expand(x)))
        h = self.se(self.activation(self.bn2(self.dw(h))))
        return self.head(h.mean((2, 3)))


class Mixer(nn.Module):
    """MLP-Mixer: token mixing across positions and channel mixing, LayerNorms, GELU."""

    def __init__(self, d=4):
        super().__init__()
        self.embed = nn.Linear(3, d)
        self.norm1, self.tokens = nn.LayerNorm(d), nn.Linear(models.SEQ, models.SEQ)
        self.norm2, self.channels = nn.LayerNorm(d), nn.Linear(d, d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.tokens(self.norm1(h).transpose(1, 2)).transpose(1, 2)
        h = h + F.gelu(self.channels(self.norm2(h)))
        return self.head(h.mean(1))


class TiedAutoencoder(nn.Module):
    """Encoder weight reused transposed by the decoder (a functional use of a module's weight)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(5, 3)
        self.bias = nn.Parameter(torch.zeros(5))

    def forward(self, x):
        return F.linear(torch.tanh(self.enc(x)), self.enc.weight.t(), self.bias)


class LstmLM(nn.Module):
    """Embedding, LSTM, token logits (a loss per position)."""

    def __init__(self):
        super().__init__()
        self.embed, self.lstm = nn.Embedding(models.VOCAB, 4), nn.LSTM(4, 5, batch_first=True)
        self.head = nn.Linear(5, models.VOCAB)

    def forward(self, idx):
        return self.head(self.lstm(self.embed(idx))[0])


class Segmenter(nn.Module):
    """Per-pixel class scores ``[B, C, H, W]`` (cross-entropy over images)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.norm, self.conv2 = nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.Conv2d(4, 3, 1)

    def forward(self, x):
        return self.conv2(F.relu(self.norm(self.conv1(x))))


class Checkpointed(nn.Module):
    """Linear → BatchNorm (training) → ReLU inside a non-reentrant ``torch.utils.checkpoint``."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.head = nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)

    def forward(self, x):
        segment = lambda t: torch.relu(self.bn(self.lin(t)))  # noqa: E731
        return self.head(torch.utils.checkpoint.checkpoint(segment, x, use_reentrant=False))


class WeightNormed(nn.Module):
    """``weight_norm`` on a Linear (dim 0, PyTorch's fused kernel) and a Conv1d (dim 1), as audio and GAN
    models use it; PyTorch's own second derivative of the fused kernel is wrong (``curvature.weight_norm``)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.utils.parametrizations.weight_norm(nn.Linear(4, 5))
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(1, 2, 2), dim=1)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.lin(x)).unsqueeze(1)
        return self.head(torch.tanh(self.conv(h)).flatten(1))


class BiLstmReadLast(nn.Module):
    """Token embedding, a two-layer bidirectional LSTM read at its last position (its last layer's reverse
    recurrent weight gets no gradient there: the tests' values of that tensor are 0/0, flagged)."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(models.VOCAB, 4)
        self.lstm = nn.LSTM(4, 3, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(6, 3)

    def forward(self, ids):
        return self.head(self.lstm(self.embedding(ids))[0][:, -1])


class EncoderDecoder(nn.Module):
    """``nn.Transformer`` (one encoder and one decoder layer, pre-norm off) with a causal target mask."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, 8)
        self.transformer = nn.Transformer(8, 2, 1, 1, 12, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=x.dtype)
        return self.head(self.transformer(h, h.flip(1), tgt_mask=mask, tgt_is_causal=True)[:, -1])


class Upsampler(nn.Module):
    """Strided and grouped transposed convolutions (decoders, GANs), PReLU, GroupNorm(1, C)."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1)
        self.norm, self.act = nn.GroupNorm(1, 4), nn.PReLU()
        self.grouped = nn.ConvTranspose2d(4, 2, 2, groups=2, bias=False)
        self.head = nn.Linear(2, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.grouped(self.act(self.norm(self.up(x))))).mean((2, 3)))


class Contrastive(nn.Module):
    """InfoNCE (SimCLR, CLIP): two views through one encoder, the logits of every pair ``z1 z2ᵀ / τ``;
    the loss is the cross-entropy of row n against column n (targets ``arange(B)``), so each sample's term
    depends on every sample's embedding."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.GELU(), nn.Linear(6, 3))

    def forward(self, x):
        z1 = F.normalize(self.encoder(x), dim=1)
        z2 = F.normalize(self.encoder(x.flip(-1) + 0.1 * torch.sin(x)), dim=1)
        return z1 @ z2.T / 0.5


class Centered(nn.Module):
    """Batch statistics in ``forward`` (no BatchNorm module): the hidden layer centred on the batch mean
    and scaled by a functional ``F.batch_norm``."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        h = torch.tanh(h - h.mean(0, keepdim=True))
        return self.head(torch.tanh(F.batch_norm(self.b(h), None, None, training=True)))


def _hf(kind):
    """A tiny Hugging Face model from a config (random weights, nothing downloaded), float64 logits."""
    import transformers

    common = dict(vocab_size=models.VOCAB, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=12, max_position_embeddings=16)
    if kind == "t5":  # relative position biases, a decoder with a causal mask
        config = transformers.T5Config(vocab_size=models.VOCAB, d_model=8, d_kv=4, d_ff=12, num_layers=1,
                                       num_heads=2, dropout_rate=0.0)
        model = transformers.T5ForConditionalGeneration(config)
    elif kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=models.VOCAB, n_embd=8, n_layer=1, n_head=2, n_positions=16,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config)
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        config = transformers.BertConfig(**common, num_labels=3, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
        model = transformers.BertForSequenceClassification(config)
    model.config.use_cache = False
    return _Logits(model)


class _Logits(nn.Module):
    """A Hugging Face model called on token ids, returning its logits (eager attention)."""

    def __init__(self, model):
        super().__init__()
        model.config._attn_implementation = "eager"
        self.model = model

    def forward(self, ids):
        if self.model.config.is_encoder_decoder:  # the targets' tokens, reversed, as the decoder's input
            return self.model(input_ids=ids, decoder_input_ids=ids.flip(1)).logits
        return self.model(input_ids=ids).logits


def _images(shape):
    return lambda g, b: torch.randn(b, *shape, generator=g, dtype=torch.float64)


def _classes(g, b):
    return torch.randint(0, 3, (b,), generator=g)


def _tokens(g, b):
    return torch.randint(0, models.VOCAB, (b, models.SEQ), generator=g)


HELD_OUT = {
    # name: (model builder, loss class, input maker, target maker); registered in problems.BUILDERS
    "convnext": (ConvNeXtBlock, nn.CrossEntropyLoss, _images((2, 4, 4)), _classes),
    "efficientnet_se": (lambda: MobileBlock(F.silu, torch.sigmoid), nn.CrossEntropyLoss, _images((2, 4, 4)), _classes),
    "mobilenetv3_se": (lambda: MobileBlock(F.hardswish, F.hardsigmoid), nn.CrossEntropyLoss, _images((2, 4, 4)),
                       _classes),
    "mlp_mixer": (Mixer, nn.CrossEntropyLoss, _images((models.SEQ, 3)), _classes),
    "rmsnorm_mlp": (lambda: nn.Sequential(nn.Linear(4, 6), nn.RMSNorm(6), nn.SiLU(), nn.Linear(6, 3)),
                    nn.CrossEntropyLoss, _images((4,)), _classes),
    "bn1d_mlp": (lambda: nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)),
                 nn.CrossEntropyLoss, _images((4,)), _classes),
    "tied_autoencoder": (TiedAutoencoder, nn.MSELoss, _images((5,)), _images((5,))),
    "lstm_lm": (LstmLM, models.TokenCrossEntropy, _tokens, _tokens),
    "segmentation": (Segmenter, nn.CrossEntropyLoss, _images((2, 3, 3)),
                     lambda g, b: torch.randint(0, 3, (b, 3, 3), generator=g)),
    "multilabel_bce": (lambda: nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)), nn.BCEWithLogitsLoss,
                       _images((4,)), lambda g, b: torch.randint(0, 2, (b, 3), generator=g).double()),
    "huber_regression": (lambda: nn.Sequential(nn.Linear(4, 6), nn.ELU(), nn.Linear(6, 2)),
                         functools.partial(nn.HuberLoss, delta=0.5), _images((4,)), _images((2,))),
    "checkpointed_bn": (Checkpointed, nn.CrossEntropyLoss, _images((4,)), _classes),
    "hf_gpt2": (lambda: _hf("gpt2"), models.TokenCrossEntropy, _tokens, _tokens),
    "hf_llama": (lambda: _hf("llama"), models.TokenCrossEntropy, _tokens, _tokens),
    "hf_bert": (lambda: _hf("bert"), nn.CrossEntropyLoss, _tokens, _classes),
    "hf_t5": (lambda: _hf("t5"), models.TokenCrossEntropy, _tokens, _tokens),
    "weight_norm": (WeightNormed, nn.CrossEntropyLoss, _images((4,)), _classes),
    "bilstm_read_last": (BiLstmReadLast, nn.CrossEntropyLoss, _tokens, _classes),
    "encoder_decoder": (EncoderDecoder, nn.CrossEntropyLoss, _images((models.SEQ, 3)), _classes),
    "transposed_conv": (Upsampler, nn.CrossEntropyLoss, _images((2, 3, 3)), _classes),
    "contrastive_infonce": (Contrastive, nn.CrossEntropyLoss, _images((4,)), lambda g, b: torch.arange(b)),
    "batch_centering": (Centered, nn.CrossEntropyLoss, _images((4,)), _classes),
}

SGD = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3)  # noqa: E731
ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731


def clip(params):
    torch.nn.utils.clip_grad_norm_(params, 0.05)


SETUPS = {
    # name: (problem name, reduction, optimizer, recipe)
    **{f"{name}": (name, "mean", SGD, None) for name in ("mlp", "cnn", "mse")},  # extended: BackPACK's curvature
    **{name: (name, "mean", SGD, None) for name in models.REALISTIC},
    **{name: (name, "mean", ADAMW, None) for name in HELD_OUT},
    "gpt_sum_adamw_clip": ("gpt", "sum", ADAMW, "clip"),
    "resnet_bn_train_adamw_clip": ("resnet_bn_train", "mean", ADAMW, "clip"),
    "mlp_gelu_silu_bf16": ("mlp_gelu_silu", "mean", ADAMW, "bf16"),
    "transformer_bf16": ("transformer", "mean", ADAMW, "bf16"),
    "mlp_accumulated": ("mlp", "mean", SGD, "accumulate"),
}

COLUMNS = {
    "business": lambda: configuration("business", extras=True),
    "full": lambda: configuration("full", extras=True),
    "business (GGN)": lambda: configuration("business", extras=True, curvature="diag_ggn_exact"),
}

REFERENCES = {
    # quantity -> reference(problem, snapshots, step) -> value or (value, layers)
    "Loss": test_loss.reference,
    "GradNorm": test_grad_norm.reference,
    "NormTest": test_norm_test.reference,
    "InnerTest": test_inner_test.reference,
    "OrthoTest": test_ortho_test.reference,
    "GradVariance": test_grad_variance.reference,
    "MeanGSNR": test_mean_gsnr.reference,
    "Alpha": test_alpha.reference,
    "HessMaxEV": test_hess_max_ev.reference,
}
RANK = {"WRONG": 0, "refused": 1, "est.": 2, "exact": 3}
"""A set-up's cell is the worst outcome of its values."""


class _Autocast(nn.Module):
    """The brute force's model of a bf16 set-up: the float32 model under bf16 autocast, its outputs
    in float64 (the same forward as the Cockpit's; the statistics of its gradients in float64)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner(x.float() if x.is_floating_point() else x).double()


class _Bf16Problem(problems.Problem):
    """A bf16 set-up's problem: first-order references of the same (autocast) forward; the curvature's
    (``plain``) of the float64 model without autocast (the GGN's Jacobian has no autocast rule)."""

    def __init__(self, plain):
        super().__init__(**vars(plain))
        self.plain = plain

    def fresh_model(self, params, state=None):
        model = _Autocast(super().fresh_model(params, state).float())
        with torch.no_grad():
            for p, value in zip(model.parameters(), params):
                p.copy_(value)
        return model


def run(name, column, steps):
    """Train set-up ``name`` with the Cockpit of ``column``: ``(problem, record, snapshots)``."""
    problem_name, reduction, optimizer, recipe = SETUPS[name]
    problem = problems.make(problem_name, 4, reduction, steps=steps)
    if recipe == "bf16":
        problem = _Bf16Problem(problem)
    if problem_name not in problems.NAMES:  # the test suite extends only the plain models
        assert not any(getattr(m, "_backpack_extend", False) for m in problem.model.modules())
    if recipe == "bf16":
        problem.model.float()
    params = list(problem.model.parameters())
    opt = optimizer(params)
    cp = Cockpit(problem.model, COLUMNS[column](), diagnose=False, accumulate=recipe == "accumulate")
    snapshots = {}
    for step, (x, y) in enumerate(problem.batches):
        state = copy.deepcopy(problem.model.state_dict())
        snapshots[step] = problems.Snapshot([p.detach().clone() for p in params], x, y, state, problems.rng_state())
        opt.zero_grad()
        parts = [(x[:2], y[:2]), (x[2:], y[2:])] if recipe == "accumulate" else [(x, y)]
        for xm, ym in parts:
            if recipe == "bf16":
                xm = xm.float() if xm.is_floating_point() else xm
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    outputs = problem.model(xm)
                loss = problem.lossfunc(outputs.float(), ym.float() if ym.is_floating_point() else ym)
            else:
                loss = problem.lossfunc(problem.model(xm), ym)
                loss = loss / len(parts) if len(parts) > 1 else loss
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
        if recipe == "clip":
            clip(params)
        opt.step()
    cp.close()
    return problem, cp.get_output(), snapshots


def _values(entry, quantity):
    """``[total, *layers]`` as floats, and the standard errors where the record has them."""
    value = entry.get(quantity)
    layers = entry.get("layers", {}).get(quantity)
    meta = entry.get("meta", {}).get(quantity, {}) or {}
    if isinstance(value, list):  # per layer (HessTrace, GradNorm)
        values, ses = [sum(value), *value], [meta.get("se"), *meta.get("layers_se", [None] * len(value))]
    else:
        values = [value] + (list(layers) if layers is not None else [])
        ses = [meta.get("se")] + list(meta.get("layers_se", [None] * len(values[1:])))
    return [float("nan") if v is None else float(v) for v in values], ses, meta


def _expected(quantity, meta, problem, snapshots, step):
    """The brute-force ``[total, *layers]`` of ``quantity`` at ``step`` (curvature: the matrix its meta names)."""
    if quantity in ("HessTrace", "TICDiag", "TICTrace", "HessMaxEV"):
        problem = getattr(problem, "plain", problem)
    if quantity in ("HessTrace", "TICDiag", "TICTrace"):
        matrix = problems.hessian if meta.get("curvature") in ("diag_h", "hutchinson") else problems.ggn
        if quantity == "HessTrace":
            diagonal = matrix(problem, snapshots[step]).diagonal()
            layers = [float(diagonal[b].sum()) for b in problems.layer_blocks(problem)]
            return [sum(layers), *layers]
        reference = (test_tic_defaults.tic_diag_of if quantity == "TICDiag" else test_tic_defaults.tic_trace_of)(matrix)
        total, layers = reference(problem, snapshots, step)
        return [float(total), *map(float, layers)]
    result = REFERENCES[quantity](problem, snapshots, step)
    if isinstance(result, tuple):
        return [float(result[0]), *map(float, result[1])]
    if isinstance(result, (list, tuple)) or (torch.is_tensor(result) and result.dim() == 1):
        layers = [float(v) for v in result]
        return [sum(layers), *layers]
    return [float(result)]


SHORT = (  # a refusal's flag -> its short reason in the table
    ("lost in the rounding", "a spread lost in rounding"),
    ("zero up to rounding", "a gradient zero up to rounding"),
    ("is exactly 0 at this step", "a gradient exactly 0"),
    ("backward passes per step", "GGN passes > max_passes"),
    ("no second derivative", "no double backward (hardsigmoid)"),
    ("hardsigmoid", "no double backward (hardsigmoid)"),
    ("accumulated step", "accumulated step"),
)


def _short(flags):
    return next((label for marker, label in SHORT if marker in flags), flags[:60])


def judge(name, column, steps):
    """``(outcome, notes)`` of set-up ``name`` in ``column`` (see the module docstring): the notes say
    which quantities were estimates and why any value was refused (NaN with a flag). A single tensor's
    value that is NaN because its statistic is rounding noise (flagged: a gradient zero up to rounding,
    a spread lost in rounding; its brute force is noise as well) or divides by an exactly zero gradient
    (flagged; its brute force is 0/0) leaves the set-up ``exact``, noted."""
    recipe = SETUPS[name][3]
    problem, record, snapshots = run(name, column, steps)
    rtol = 5e-2 if recipe == "bf16" else 1e-7
    worst, notes = "exact", []

    def note(outcome, text):
        nonlocal worst
        if RANK[outcome] < RANK[worst]:
            worst = outcome
        if text not in notes:
            notes.append(text)

    for step in range(steps - 1):
        entry = record.get(step, {})
        flags = " ".join(entry.get("flags", []))
        for quantity in [*REFERENCES, "HessTrace", "TICDiag", "TICTrace"]:
            if quantity not in entry:
                continue
            values, ses, meta = _values(entry, quantity)
            if all(math.isnan(v) for v in values):
                note("refused" if flags else "WRONG", f"{quantity} refused: {_short(flags)}" if flags
                     else f"{quantity}: NaN without a flag")
                continue
            try:
                expected = _expected(quantity, meta, problem, snapshots, step)
            except RuntimeError:  # no second derivative (hardsigmoid): no dense Hessian to compare with
                note("exact", f"{quantity} not checked (no brute force)")
                continue
            tolerance = max(1e-3, rtol) if quantity == "HessMaxEV" else rtol
            scale = max(abs(e) for e in expected) or 1.0
            for value, se, want in zip(values, ses, expected):
                if math.isnan(value):  # one tensor's value
                    noise = "rounding" in flags or "is exactly 0 at this step" in flags  # (its brute force: 0/0)
                    note("exact" if noise else "refused" if flags else "WRONG",
                         f"{quantity}: a tensor NaN, {_short(flags)}" if flags else f"{quantity}: a NaN without a flag")
                    continue
                error = abs(value - want)
                if error <= tolerance * max(abs(want), 1e-3 * scale):
                    continue
                if meta.get("curvature") in ("hutchinson", "diag_ggn_mc") and se is not None and error <= 4 * se:
                    note("est.", f"{quantity} estimated ({meta['curvature']}, within 4 SE)")
                    continue
                note("WRONG", f"{quantity}: {value:.4g} against {want:.4g} (step {step}"
                     + (f", {error / se:.1f} SE" if se else "") + ")")
    return worst, notes


def compact(notes):
    """The notes of one cell, quantities with the same note grouped: ``"NormTest, InnerTest: a tensor NaN,
    a gradient zero up to rounding"``."""
    groups = {}
    for text in notes:
        quantity, _, rest = text.partition(" ") if " estimated" in text or " refused" in text \
            or " not checked" in text else text.partition(": ")
        groups.setdefault(rest, []).append(quantity.rstrip(":"))
    return "; ".join(f"{', '.join(dict.fromkeys(names))}{' ' if rest[:1] in ('e', 'r', 'n') else ': '}{rest}"
                     for rest, names in groups.items())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(SETUPS))
    parser.add_argument("--steps", type=int, default=4, help="steps per run (values of all but the last compared)")
    parser.add_argument("--json", help="also write the table to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    problems.BUILDERS.update(HELD_OUT)
    names = args.only or list(SETUPS)
    rows, counts, began = [], {c: {} for c in COLUMNS}, time.perf_counter()
    for name in names:
        cells = []
        for column in COLUMNS:
            outcome, notes = judge(name, column, args.steps)
            counts[column][outcome] = counts[column].get(outcome, 0) + 1
            cells.append(outcome + (f" ({compact(notes)})" if notes else ""))
        rows.append([name, *cells])
        print(" | ".join(rows[-1]), flush=True)
    summary = {c: ", ".join(f"{n} {k}" for k, n in sorted(v.items(), key=lambda kv: -RANK[kv[0]])) for c, v in counts.items()}
    print(f"\n{len(names)} set-ups in {time.perf_counter() - began:.0f} s; " + "; ".join(f"{c}: {s}" for c, s in summary.items()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"header": ["set-up", *COLUMNS], "rows": rows, "summary": summary,
                       "command": "python -m experiments.curvature_setups"}, file, indent=1)


if __name__ == "__main__":
    main()
