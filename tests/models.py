"""Realistic test models (float64, tiny): the set-ups people train, beyond plain MLPs and CNNs.

Each builder returns ``(model, loss module, input maker, target maker)``; the loss
module's ``reduction`` is set by ``problems.make``. Models are built from the global
seed, so two builds after ``torch.manual_seed`` are identical.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ = 11, 5


class TokenCrossEntropy(nn.Module):
    """Cross-entropy over every token of ``[B, T, V]`` logits, flattened batch-major."""

    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=self.reduction)


class Block(nn.Module):
    """Residual block: conv-norm-activation-conv-norm plus the input, then the activation."""

    def __init__(self, channels, norm, activation=F.relu):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = norm(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = norm(channels)
        self.activation = activation

    def forward(self, x):
        h = self.activation(self.norm1(self.conv1(x)))
        return self.activation(x + self.norm2(self.conv2(h)))


class ResNet(nn.Module):
    """Stem, one residual block, global average, head; ReLU by default (SiLU: EfficientNet's)."""

    def __init__(self, norm, activation=F.relu):
        super().__init__()
        self.stem = nn.Conv2d(2, 4, 3, padding=1, bias=False)  # a bias before a norm has no gradient
        self.norm = norm(4)
        self.block = Block(4, norm, activation)
        self.head = nn.Linear(4, 3)
        self.activation = activation

    def forward(self, x):
        h = self.block(self.activation(self.norm(self.stem(x))))
        return self.head(h.mean((2, 3)))


def _batch_norm(channels):
    return nn.BatchNorm2d(channels)


def _group_norm(channels):
    return nn.GroupNorm(2, channels)


def resnet_bn_eval():
    model = ResNet(_batch_norm)
    with torch.no_grad():  # running statistics that are not the defaults
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.8, 1.25)
    return model.eval()


class Encoder(nn.Module):
    """Features → Linear embedding → TransformerEncoderLayer (batch first) → mean → head."""

    def __init__(self, dropout):
        super().__init__()
        self.embed = nn.Linear(3, 8)
        self.layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, dropout=dropout, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.layer(self.embed(x)).mean(1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class GPT(nn.Module):
    """Token embedding, learned positions (a bare parameter), one pre-norm block, tied lm head."""

    def __init__(self, d=8):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(0.1 * torch.randn(SEQ, d))
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, 2)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.head(self.ln_f(x))


class ViTLike(nn.Module):
    """Shared tensors broadcast into the batch: a class token (expand + cat), positions from an
    Embedding of ``arange`` (added with broadcasting), a learned scale; attention without dropout."""

    def __init__(self, d=8):
        super().__init__()
        self.patch = nn.Linear(3, d)
        self.cls = nn.Parameter(0.1 * torch.randn(1, 1, d))
        self.pos = nn.Embedding(SEQ + 1, d)
        self.gamma = nn.Parameter(torch.rand(d) + 0.5)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.patch(x)], 1)
        h = tokens + self.pos(torch.arange(tokens.shape[1])).unsqueeze(0)
        h = h + self.attn(h, h, h, need_weights=False)[0] * self.gamma
        return self.head(self.norm(h)[:, 0])


class LSTMReadout(nn.Module):
    """2-layer bidirectional LSTM read out through its last output and its final hidden states."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(8 + 16, 3)

    def forward(self, x):
        out, (h_n, _) = self.lstm(x)
        return self.head(torch.cat([out[:, -1], h_n.transpose(0, 1).reshape(x.shape[0], -1)], 1))


class GRUSeqFirst(nn.Module):
    """A GRU in its default sequence-first layout, fed by a transpose of batch-first data."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        out, _ = self.gru(x.transpose(0, 1))
        return self.head(out[-1])


class ScaledResidual(nn.Module):
    """A custom layer with parameters of its own: ``x ⊙ s + tanh(x) M``."""

    def __init__(self, d):
        super().__init__()
        self.s = nn.Parameter(torch.rand(d) + 0.5)
        self.m = nn.Parameter(0.3 * torch.randn(d, d))

    def forward(self, x):
        return x * self.s + torch.tanh(x) @ self.m


class SparseExpert(nn.Module):
    """A sparse mixture of experts' habit: ``expert`` (an MLP) runs on the samples routed to it (first input feature
    above 1), its outputs added to theirs, and is skipped when no sample is routed to it (its parameters are then
    outside the loss's graph)."""

    def __init__(self):
        super().__init__()
        self.inp, self.act, self.head = nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)
        self.expert = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))

    def forward(self, x):
        h = self.act(self.inp(x))
        out = self.head(h)
        routed = (x[:, 0] > 1).nonzero()[:, 0]
        if len(routed):
            out = out.index_add(0, routed, self.expert(h[routed]))
        return out


def routed_to_expert(g, b):
    """``SparseExpert``'s inputs of 8 samples: samples 6 and 7 routed to the expert, no other."""
    x = torch.randn(b, 4, generator=g, dtype=torch.float64)
    x[:, 0] = x[:, 0].clamp(max=0.5)
    x[[6, 7], 0] = torch.tensor([2.0, 1.5], dtype=x.dtype)
    return x


def _features(shape):
    return lambda g, b: torch.randn(b, *shape, generator=g, dtype=torch.float64)


def _classes(g, b):
    return torch.randint(0, 3, (b,), generator=g)


def _tokens(g, b):
    return torch.randint(0, VOCAB, (b, SEQ), generator=g)


REALISTIC = {
    # name: (model builder, loss class, input maker, target maker)
    "resnet_bn_train": (lambda: ResNet(_batch_norm), nn.CrossEntropyLoss, _features((2, 4, 4)), _classes),
    "resnet_bn_eval": (resnet_bn_eval, nn.CrossEntropyLoss, _features((2, 4, 4)), _classes),
    "resnet_gn": (lambda: ResNet(_group_norm), nn.CrossEntropyLoss, _features((2, 4, 4)), _classes),
    "transformer": (lambda: Encoder(0.0), nn.CrossEntropyLoss, _features((SEQ, 3)), _classes),
    "transformer_dropout": (lambda: Encoder(0.2), nn.CrossEntropyLoss, _features((SEQ, 3)), _classes),
    "gpt": (GPT, TokenCrossEntropy, _tokens, _tokens),
    "vit_like": (ViTLike, nn.CrossEntropyLoss, _features((SEQ, 3)), _classes),
    "lstm": (LSTMReadout, nn.CrossEntropyLoss, _features((SEQ, 3)), _classes),
    "gru": (GRUSeqFirst, nn.CrossEntropyLoss, _features((SEQ, 3)), _classes),
    "mlp_inplace": (
        lambda: nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 3)),
        nn.CrossEntropyLoss, _features((4,)), _classes,
    ),
    "mlp_gelu_silu": (
        lambda: nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 5), nn.SiLU(), nn.Linear(5, 2)),
        nn.MSELoss, _features((4,)), lambda g, b: torch.randn(b, 2, generator=g, dtype=torch.float64),
    ),
    "custom": (
        lambda: nn.Sequential(nn.Linear(4, 5), ScaledResidual(5), nn.Linear(5, 3)),
        nn.CrossEntropyLoss, _features((4,)), _classes,
    ),
}
