"""Realistic training recipes, healthy and with one planted mistake each, diagnosed live.

``python -m experiments.realistic_diagnosis`` trains every recipe of ``RECIPES`` for
``--seeds`` seeds (default 3) on one CPU thread and prints each run's findings and a
confusion table: for a faulty recipe, whether its expected kind (and layer, where the kind
has one) was found within 20 % of its steps or 30 steps of the mistake's onset; for a
healthy one, whether it raised no finding of severity ``warning`` or ``error`` (``info``
notes are allowed). ``--only NAME ...`` picks recipes, ``--steps`` shortens every run.

The recipes are written the way such loops are written in practice, kept small enough
for a CPU: a character-level GPT (AdamW, warm-up + cosine, clipping, dropout) and an LSTM
language model on text from Python's own standard-library sources (read locally), a ViT
with a zero-initialised class token, a ResNet with BatchNorm and SGD + weight decay
(OneCycle) on upscaled digits, bf16 autocast, gradient accumulation x4, small-batch SGD,
label smoothing with dropout, a Huber regression on targets with outliers, fine-tuning a
head on a frozen body, raw 0..255 pixels into a first BatchNorm. Each faulty twin makes one
mistake people make, some of them late (a learning rate that collapses at step 30, a loss
scale that starts blowing up at step 100). ``tests/diagnosis/test_realistic.py`` runs a
fast subset.
"""

import argparse
import math
import os
import sysconfig
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from torch import nn

from experiments.common import kaiming, load_digits_tensors, single_thread

# ----------------------------------------------------------------------------- data

_TEXT = None


def text(chars=60000):
    """Characters of Python's own standard-library sources (read from this interpreter's install)."""
    global _TEXT
    if _TEXT is None:
        root = sysconfig.get_paths()["stdlib"]
        parts = []
        for name in ("textwrap.py", "argparse.py", "pathlib.py", "functools.py", "dataclasses.py"):
            try:
                with open(os.path.join(root, name), encoding="utf-8") as handle:
                    parts.append(handle.read())
            except OSError:
                continue
        _TEXT = "".join(parts) or "def f(x):\n    return x + 1\n" * 4000
    return _TEXT[:chars]


def char_data(seed, context=32):
    """``(train, valid)`` as token tensors [N] and the vocabulary size (an 90/10 split of the text)."""
    source = text()
    vocab = sorted(set(source))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in source], dtype=torch.long)
    cut = int(0.9 * len(ids))
    return ids[:cut], ids[cut:], len(vocab)


def char_batch(ids, batch, context, generator):
    starts = torch.randint(0, len(ids) - context - 1, (batch,), generator=generator)
    x = torch.stack([ids[s:s + context] for s in starts])
    y = torch.stack([ids[s + 1:s + context + 1] for s in starts])
    return x, y


def digits(seed, scaling="unit", upscale=False, shuffle_labels=False, train_size=None, label_noise=0.0):
    (x, y), (xv, yv) = load_digits_tensors(seed=seed, scaling=scaling)
    if train_size is not None:  # a small training set (the held-out set stays whole)
        x, y = x[:train_size], y[:train_size]
    if label_noise:  # a share of the training labels replaced by random classes (annotation errors)
        g = torch.Generator().manual_seed(seed + 13)
        wrong = torch.rand(len(y), generator=g) < label_noise
        y = torch.where(wrong, torch.randint(0, 10, (len(y),), generator=g), y)
    if upscale:  # 16 x 16, as a small image pipeline would resize
        x = nn.functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        xv = nn.functional.interpolate(xv, scale_factor=2, mode="bilinear", align_corners=False)
    if shuffle_labels:
        y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 11))]
    return (x, y), (xv, yv)


def outlier_regression(seed, n=1200, features=8):
    """A linear-plus-sine target with 3 % of the training targets replaced by large outliers."""
    g = torch.Generator().manual_seed(seed + 5)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g) / math.sqrt(features)
    y = x @ w + 0.3 * torch.sin(2 * x[:, :1]) + 0.05 * torch.randn(n, 1, generator=g)
    cut = int(0.8 * n)
    outliers = torch.rand(cut, generator=g) < 0.03
    y_train = y[:cut].clone()
    y_train[outliers] += 15.0 * torch.randn(int(outliers.sum()), 1, generator=g)
    return (x[:cut], y_train), (x[cut:], y[cut:])


# ----------------------------------------------------------------------------- models


class CharGPT(nn.Module):
    """A two-block causal transformer (pre-LayerNorm, GELU MLP, dropout, tied nothing)."""

    def __init__(self, vocab, width=64, heads=4, blocks=2, context=32, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(context, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        mask = torch.triu(torch.full((context, context), float("-inf")), 1)
        self.register_buffer("mask", mask)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.embed(ids) + self.position[:t]
        return self.head(self.norm(self.blocks(h, mask=self.mask[:t, :t], is_causal=True)))


class LstmLM(nn.Module):
    def __init__(self, vocab, width=96, scale=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        self.lstm = nn.LSTM(32, width, batch_first=True)
        self.head = nn.Linear(width, vocab)
        if scale is not None:
            with torch.no_grad():
                for name, p in self.lstm.named_parameters():
                    if "weight" in name:
                        p.mul_(scale)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


class ReluRNN(nn.Module):
    """A ReLU RNN language model, recurrent weights initialised to the identity (IRNN, Le et al. 2015)."""

    def __init__(self, vocab, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        self.rnn = nn.RNN(32, width, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(width, vocab)
        with torch.no_grad():
            self.rnn.weight_hh_l0.copy_(torch.eye(width))

    def forward(self, ids):
        out, _ = self.rnn(self.embed(ids))
        return self.head(out)


class TinyViT(nn.Module):
    """2x2 patches of an 8x8 digit, a class token initialised at 0 (as timm/torchvision do)."""

    def __init__(self, width=48, patch=2):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.patch = nn.Conv2d(1, width, patch, stride=patch)
        self.position = nn.Parameter(torch.randn(1, (8 // patch) ** 2 + 1, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], 1) + self.position
        return self.head(self.norm(self.encoder(tokens))[:, 0])


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(x + self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))


def resnet(channels=16):
    return nn.Sequential(nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(),
                         Block(channels), nn.MaxPool2d(2), Block(channels), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, 10))


def mlp(n_in=64, hidden=(128,), n_out=10, dropout=0.0, first=None):
    layers = [nn.Flatten()] + ([first] if first is not None else [])
    for width in hidden:
        layers += [nn.Linear(n_in, width), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout else [])
        n_in = width
    return nn.Sequential(*layers, nn.Linear(n_in, n_out))


class MaskedMeanPool(nn.Module):
    """Mean over the valid rows of a digit: a hand-written masked mean (sum / count)."""

    def __init__(self, empty_first=False):
        super().__init__()
        self.empty_first = empty_first

    def forward(self, h):
        rows = h.reshape(len(h), 8, -1)
        mask = torch.ones(len(h), 8)
        if self.empty_first:  # BUG: the mask built from lengths marks the first sample empty
            mask[0] = 0
        return (rows * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)


# ----------------------------------------------------------------------------- recipes


@dataclass
class Recipe:
    """``build(seed)`` returns ``(model, data, optimizer factory)``; data is ``(train, valid)`` or a token task."""

    build: Callable
    expect: Optional[tuple] = None       # (kind, layer) or None: healthy
    loss: Callable = nn.functional.cross_entropy
    steps: int = 120
    batch: int = 32
    task: str = "classify"               # "classify", "regress" or "chars"
    accumulate: int = 1
    zero_grad: bool = True
    clip: Optional[float] = None
    schedule: Optional[Callable] = None  # (optimizer, steps) -> scheduler, stepped every optimizer step
    bf16: bool = False
    log_every: Optional[int] = 20
    log_slot: str = "valid"              # where the held-out numbers go in cp.log ("valid" or "test")
    onset: Union[int, Callable] = 0      # the step the mistake begins (or record -> that step)
    loss_scale: Optional[Callable] = None  # step -> factor on the loss (a late blow-up)
    quantities: Optional[Callable] = None  # () -> quantities to track besides the diagnosis' signals
    note: str = ""


def adamw(lr, wd=0.01):
    return lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=wd)


def adam(lr):
    return lambda params: torch.optim.Adam(params, lr=lr)


def sgd(lr, momentum=0.9, wd=0.0):
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)


def warmup_cosine(warmup=20):
    def make(optimizer, steps):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
            1 + math.cos(math.pi * min(1.0, s / steps))))

    return make


def one_cycle(peak):
    return lambda optimizer, steps: torch.optim.lr_scheduler.OneCycleLR(optimizer, peak, total_steps=steps + 1)


def cosine(optimizer, steps):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)


def per_epoch_multistep_every_batch(optimizer, steps):
    """BUG: ``MultiStepLR(milestones=[30, 40])`` meant in epochs, stepped after every batch."""
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, [30, 40], 0.1)


def milestone(step, gamma):
    """``MultiStepLR(milestones=[step], gamma)``: the learning rate times ``gamma`` from ``step`` on."""
    return lambda optimizer, steps: torch.optim.lr_scheduler.MultiStepLR(optimizer, [step], gamma)


def warmup_then_milestone(warmup, step, gamma):
    """Linear warm-up, then the rate times ``gamma`` from ``step`` on (a milestone meant in epochs)."""
    return lambda optimizer, steps: torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (gamma if s >= step else 1.0))


def exponential(gamma):
    """``ExponentialLR(gamma)`` stepped every batch: a smooth decay to almost nothing (meant per epoch)."""
    return lambda optimizer, steps: torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma)


def cosine_over(horizon, floor=1e-5):
    """Cosine decay over ``horizon`` steps, then ``floor`` times the rate (the horizon given in epochs,
    the scheduler stepped every batch)."""
    return lambda optimizer, steps: torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: max(floor, 0.5 * (1 + math.cos(math.pi * min(1.0, s / horizon)))))


def restarts(period):
    """SGDR: cosine annealing with warm restarts every ``period`` steps (Loshchilov and Hutter 2017)."""
    return lambda optimizer, steps: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, period)


def step_decay(every, gamma=0.1):
    return lambda optimizer, steps: torch.optim.lr_scheduler.StepLR(optimizer, every, gamma)


def linear_warmup_decay(warmup=10):
    """Linear warm-up, then linear decay to 0 at the last step (the Hugging Face default)."""
    return lambda optimizer, steps: torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))))


def _lr_below(fraction):
    """The onset of a decayed learning rate: the first record whose lr is <= ``fraction`` of the peak so far."""
    def onset(record):
        peak = 0.0
        for step in sorted(record):
            lr = (record[step].get("GradPresence") or {}).get("lr")
            if lr is None:
                continue
            peak = max(peak, lr)
            if lr <= fraction * peak:
                return step
        return 0

    return onset


def small_cnn(channels=16):
    """Two conv blocks and a linear head on 8 x 8 digits, no normalisation."""
    return nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, 2 * channels, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * channels * 16, 10))


def _chars(model_factory, optimizer):
    def build(seed):
        train, valid, vocab = char_data(seed)
        return model_factory(vocab), (train, valid), optimizer

    return build


def _frozen_body(seed):
    model = mlp(hidden=(64, 64))
    for layer in list(model)[:3]:  # fine-tune the head: the body stays as it is
        layer.requires_grad_(False)
    return model, digits(seed), lambda params: torch.optim.Adam([p for p in params if p.requires_grad], lr=3e-3)


def _biased_mlp(value):
    model = mlp(hidden=(64, 64))
    nn.init.constant_(model[3].bias, value)  # BUG: the second hidden layer's bias initialised at -4
    return model


def _tanh_mlp(gain):
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    with torch.no_grad():
        model[1].weight.mul_(gain)  # BUG: std 1 instead of 1/sqrt(fan_in) (20x too large)
    return model


def _deep_sigmoid_mlp(depth=8, width=64):
    """BUG: eight sigmoid layers, no normalisation or residuals: each layer scales the gradient by <= 1/4."""
    layers = [nn.Flatten()]
    for i in range(depth):
        layers += [nn.Linear(64 if i == 0 else width, width), nn.Sigmoid()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _hess_max_ev():
    from cockpit_lite.quantities import HessMaxEV

    return [HessMaxEV()]


def _held_out_minimum(record):
    """The onset of overfitting: the step at which the logged held-out loss is lowest."""
    held = [(e["valid_loss"], s) for s, e in record.items() if e.get("valid_loss") is not None]
    return min(held)[1] if held else 0


def huber(output, target):
    return nn.functional.huber_loss(output, target, delta=1.0)


def smoothed(output, target):
    return nn.functional.cross_entropy(output, target, label_smoothing=0.1)


RECIPES = {
    # -- healthy recipes
    "gpt_adamw_warmup_cosine": Recipe(_chars(lambda v: CharGPT(v), adamw(3e-3)), task="chars", clip=1.0,
                                      schedule=warmup_cosine(), steps=150, note="char GPT, AdamW, warm-up + cosine"),
    "lstm_lm_clipped": Recipe(_chars(lambda v: LstmLM(v), adam(3e-3)), task="chars", clip=1.0, steps=150,
                              note="LSTM LM, Adam, clipping"),
    "vit_zero_cls_token": Recipe(lambda s: (TinyViT(), digits(s, scaling="standard"), adamw(1e-3)),
                                 schedule=warmup_cosine(10), note="ViT, class token initialised at 0"),
    "resnet_bn_sgd_onecycle": Recipe(lambda s: (resnet(), digits(s, upscale=True), sgd(0.05, wd=5e-4)),
                                     schedule=one_cycle(0.1), note="ResNet-BN, SGD + weight decay, OneCycle"),
    "bf16_autocast_mlp": Recipe(lambda s: (mlp(), digits(s), adam(1e-3)), bf16=True, note="bf16 autocast"),
    "accumulation_x4": Recipe(lambda s: (mlp(), digits(s), sgd(0.05)), accumulate=4, batch=8,
                              note="accumulation x4, cp around every micro-batch"),
    "small_batch_sgd": Recipe(lambda s: (mlp(), digits(s), sgd(0.02)), batch=4, note="batch 4, SGD"),
    "label_smoothing_dropout": Recipe(lambda s: (mlp(hidden=(128, 128), dropout=0.2), digits(s), adamw(1e-3)),
                                      loss=smoothed, schedule=cosine, note="label smoothing 0.1, dropout 0.2"),
    "huber_outliers": Recipe(lambda s: (mlp(n_in=8, hidden=(64,), n_out=1), outlier_regression(s), adam(3e-3)),
                             loss=huber, task="regress", note="Huber loss, 3% outlier targets"),
    "frozen_body_finetune": Recipe(_frozen_body, note="head fine-tuned on a frozen body"),
    "bn_first_raw255": Recipe(lambda s: (mlp(first=nn.BatchNorm1d(64)), digits(s, scaling="raw255"), sgd(0.05)),
                              note="raw 0..255 pixels into a first BatchNorm"),
    "test_slot_logging": Recipe(lambda s: (mlp(), digits(s), adam(1e-3)), log_slot="test",
                                note="held-out numbers logged in the test slots"),
    # -- faulty twins
    "accumulation_no_zero_grad": Recipe(lambda s: (mlp(), digits(s), sgd(0.05)), ("missing_zero_grad", None),
                                        accumulate=4, batch=8, zero_grad=False, note="accumulation x4, no zero_grad"),
    "lr_collapse_multistep": Recipe(lambda s: (mlp(), digits(s), sgd(0.05)), ("lr_too_low", None),
                                    schedule=per_epoch_multistep_every_batch, onset=30,
                                    note="per-epoch MultiStepLR stepped every batch"),
    "irnn_lm_unclipped": Recipe(_chars(lambda v: ReluRNN(v), sgd(0.1)), ("exploding_gradients", "rnn"),
                                task="chars", steps=60, note="identity-initialised ReLU RNN LM, SGD 0.1, no clipping"),
    "shuffled_labels_test_slot": Recipe(lambda s: (mlp(), digits(s, shuffle_labels=True), adam(1e-3)),
                                        ("shuffled_labels", None), log_slot="test", log_every=10,
                                        note="training labels permuted, held-out logged in the test slot"),
    "late_loss_scale_blowup": Recipe(lambda s: (mlp(), digits(s), sgd(0.02, momentum=0.0)),
                                     ("exploding_gradients", "3"), steps=160, onset=100,
                                     loss_scale=lambda step: 10.0 ** (max(0, step - 100) / 5),
                                     note="a loss scale that grows 10x every 5 steps from step 100"),
    "masked_mean_empty_row": Recipe(lambda s: (nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(),
                                                             MaskedMeanPool(empty_first=True), nn.Linear(8, 10)),
                                               digits(s), adam(1e-3)), ("nan_loss", "3"),
                                    note="a masked mean over an empty row: 0 / 0"),
    "raw255_into_linear": Recipe(lambda s: (mlp(), digits(s, scaling="raw255"), sgd(1e-3)),
                                 ("unnormalized_inputs", None), note="raw 0..255 pixels into a Linear layer"),
    "vit_adam_lr_1": Recipe(lambda s: (TinyViT(), digits(s, scaling="standard"), adam(1.0)), ("lr_too_high", None),
                            note="ViT, Adam at 1.0"),
    "gpt_adamw_no_warmup_high_lr": Recipe(_chars(lambda v: CharGPT(v), adamw(0.1)), ("lr_too_high", None),
                                          task="chars", steps=100, note="char GPT, AdamW 0.1, no warm-up"),
    "dead_relu_negative_bias": Recipe(lambda s: (_biased_mlp(-4.0), digits(s), sgd(0.05)), ("dead_relu", "4"),
                                      note="a hidden bias initialised at -4"),
    "lstm_gates_saturated_init": Recipe(_chars(lambda v: LstmLM(v, scale=20.0), adam(3e-3)),
                                        ("saturated_activations", "lstm"), task="chars", clip=1.0, steps=60,
                                        note="LSTM LM, LSTM weights 20x too large: the gates saturate"),
    "tanh_huge_init": Recipe(lambda s: (_tanh_mlp(20.0), digits(s), sgd(0.05)), ("saturated_activations", "2"),
                             note="tanh after weights 20x too large"),
    "overfit_noisy_small_train_set": Recipe(
        lambda s: (mlp(hidden=(256, 256)), digits(s, train_size=100, label_noise=0.2), adam(3e-3)),
        ("overfitting", None), steps=300, log_every=5, onset=_held_out_minimum,
        note="a wide MLP memorising 100 digits with 20% wrong labels, no regularisation"),
    "deep_sigmoid_mlp": Recipe(lambda s: (_deep_sigmoid_mlp(), digits(s), sgd(0.1)), ("vanishing_gradients", "1"),
                               note="eight sigmoid layers, default init, no normalisation"),
    "full_batch_gd_lr_above_2_over_lambda": Recipe(
        lambda s: (mlp(), digits(s), sgd(2.0, momentum=0.0)), ("edge_of_stability", None), batch=1437, steps=60,
        quantities=_hess_max_ev, note="full-batch GD at lr 2, HessMaxEV tracked"),
    # -- learning rates that collapse at a milestone (lr x 1e-4 .. 1e-3 in one step), several models and optimisers
    "lr_collapse_resnet_adam": Recipe(lambda s: (resnet(), digits(s, upscale=True), adam(1e-3)), ("lr_too_low", None),
                                      schedule=milestone(40, 1e-4), onset=40,
                                      note="ResNet-BN, Adam, MultiStepLR milestone 40 with gamma 1e-4"),
    "lr_collapse_gpt_warmup": Recipe(_chars(lambda v: CharGPT(v), adamw(3e-3)), ("lr_too_low", None), task="chars",
                                     clip=1.0, schedule=warmup_then_milestone(10, 60, 1e-4), onset=60, steps=150,
                                     note="char GPT, AdamW, warm-up then lr x 1e-4 at step 60"),
    "lr_collapse_lstm_clipped": Recipe(_chars(lambda v: LstmLM(v), adam(3e-3)), ("lr_too_low", None), task="chars",
                                       clip=1.0, schedule=milestone(50, 1e-3), onset=50, steps=150,
                                       note="LSTM LM, Adam, MultiStepLR milestone 50 with gamma 1e-3"),
    "lr_collapse_cnn_sgd": Recipe(lambda s: (small_cnn(), digits(s), sgd(0.05)), ("lr_too_low", None),
                                  schedule=milestone(60, 1e-4), onset=60, note="CNN, SGD, milestone 60, gamma 1e-4"),
    # -- a learning rate too small from the first step
    "lr_tiny_gpt_adamw": Recipe(_chars(lambda v: CharGPT(v), adamw(1e-6)), ("lr_too_low", None), task="chars",
                                clip=1.0, schedule=warmup_cosine(), steps=100, note="char GPT, AdamW at 1e-6"),
    "lr_tiny_resnet_sgd": Recipe(lambda s: (resnet(), digits(s, upscale=True), sgd(1e-4, wd=5e-4)),
                                 ("lr_too_low", None), note="ResNet-BN, SGD + momentum at 1e-4"),
    "lr_tiny_lstm_adam": Recipe(_chars(lambda v: LstmLM(v), adam(1e-6)), ("lr_too_low", None), task="chars",
                                clip=1.0, steps=100, note="LSTM LM, Adam at 1e-6"),
    "lr_tiny_vit_adamw": Recipe(lambda s: (TinyViT(), digits(s, scaling="standard"), adamw(1e-6)),
                                ("lr_too_low", None), note="ViT, AdamW at 1e-6"),
    "lr_tiny_mlp_sgd": Recipe(lambda s: (mlp(), digits(s), sgd(1e-4, momentum=0.0)), ("lr_too_low", None),
                              note="MLP, plain SGD at 1e-4"),
    # -- a learning rate that decays smoothly to almost nothing early in the run
    "lr_decay_exponential_mlp": Recipe(lambda s: (mlp(), digits(s), sgd(0.05)), ("lr_too_low", None), steps=150,
                                       schedule=exponential(0.9), onset=_lr_below(1 / 30),
                                       note="MLP, SGD, ExponentialLR(0.9) stepped every batch"),
    "lr_decay_exponential_cnn_adam": Recipe(lambda s: (small_cnn(), digits(s), adam(1e-3)), ("lr_too_low", None),
                                            steps=150, schedule=exponential(0.93), onset=_lr_below(1 / 30),
                                            note="CNN, Adam, ExponentialLR(0.93) stepped every batch"),
    "lr_decay_cosine_horizon_gpt": Recipe(_chars(lambda v: CharGPT(v), adamw(3e-3)), ("lr_too_low", None),
                                          task="chars", clip=1.0, steps=150, schedule=cosine_over(40),
                                          onset=_lr_below(1 / 30),
                                          note="char GPT, cosine over 40 steps (an epoch count), then 1e-5 x"),
    "lr_decay_cosine_horizon_lstm": Recipe(_chars(lambda v: LstmLM(v), adam(3e-3)), ("lr_too_low", None),
                                           task="chars", clip=1.0, steps=150, schedule=cosine_over(50),
                                           onset=_lr_below(1 / 30), note="LSTM LM, cosine over 50 steps, then 1e-5 x"),
    # -- recurrent nets whose gradients explode (no clipping)
    "irnn_lm_adam_unclipped": Recipe(_chars(lambda v: ReluRNN(v), adam(3e-2)), ("exploding_gradients", "rnn"),
                                     task="chars", steps=60, note="identity-initialised ReLU RNN LM, Adam 3e-2"),
    "irnn_wide_sgd_unclipped": Recipe(_chars(lambda v: ReluRNN(v, width=128), sgd(0.05, momentum=0.0)),
                                      ("exploding_gradients", "rnn"), task="chars", steps=60,
                                      note="identity-initialised ReLU RNN LM, 128 units, plain SGD 0.05"),
    # -- sustained overfitting, several models
    "overfit_cnn_small_noisy": Recipe(
        lambda s: (small_cnn(32), digits(s, train_size=100, label_noise=0.2), adam(3e-3)), ("overfitting", None),
        steps=300, log_every=5, onset=_held_out_minimum, note="a CNN memorising 100 digits with 20% wrong labels"),
    "overfit_vit_small_noisy": Recipe(
        lambda s: (TinyViT(), digits(s, scaling="standard", train_size=100, label_noise=0.2), adamw(3e-3, wd=0.0)),
        ("overfitting", None), steps=300, log_every=5, onset=_held_out_minimum,
        note="a ViT memorising 100 digits with 20% wrong labels"),
    # -- more healthy recipes: schedules with restarts, steps and decays to 0, deep nets, held-out rises
    "sgdr_restarts_mlp": Recipe(lambda s: (mlp(hidden=(128, 128)), digits(s), sgd(0.1)), schedule=restarts(30),
                                steps=150, log_every=5, note="MLP, SGD, warm restarts every 30 steps"),
    "resnet_bn_sgd_cosine_wd": Recipe(lambda s: (resnet(), digits(s, upscale=True), sgd(0.1, wd=5e-4)),
                                      schedule=cosine, log_every=10, note="ResNet-BN, SGD + wd, cosine"),
    "gpt_adamw_linear_decay": Recipe(_chars(lambda v: CharGPT(v), adamw(2e-3, wd=0.1)), task="chars", clip=1.0,
                                     schedule=linear_warmup_decay(10), steps=150, log_every=10,
                                     note="char GPT, AdamW wd 0.1, linear warm-up and decay to 0"),
    "deep_relu_kaiming_adamw": Recipe(lambda s: (kaiming(mlp(hidden=(128,) * 5)), digits(s), adamw(1e-3)),
                                      schedule=cosine, steps=300, log_every=5,
                                      note="6 ReLU layers, Kaiming init, AdamW + cosine, 300 steps"),
    "deep_relu_default_sgd": Recipe(lambda s: (mlp(hidden=(64,) * 4), digits(s, scaling="standard"), sgd(0.05)),
                                    steps=300, log_every=10, note="5 ReLU layers, default init, SGD + momentum"),
    "lstm_lm_sgd_step_decay": Recipe(_chars(lambda v: LstmLM(v), sgd(1.0, momentum=0.0)), task="chars", clip=0.25,
                                     schedule=step_decay(50, 0.25), steps=150, log_every=10,
                                     note="LSTM LM, SGD 1.0, clipping 0.25, lr / 4 every 50 steps"),
    "mlp_three_step_decays": Recipe(lambda s: (mlp(), digits(s), sgd(0.1)), schedule=step_decay(40), steps=160,
                                    log_every=10, note="MLP, SGD, lr / 10 at 40, 80, 120 (a classic schedule)"),
    "bf16_autocast_vit": Recipe(lambda s: (TinyViT(), digits(s, scaling="standard"), adamw(1e-3)), bf16=True,
                                schedule=warmup_cosine(10), note="ViT under bf16 autocast"),
    "cnn_adam_small_held_out": Recipe(lambda s: (small_cnn(), digits(s), adam(3e-3)), steps=200, log_every=5,
                                      note="CNN, Adam, held-out every 5 steps (it converges, then wobbles)"),
}
"""name -> Recipe."""

HEALTHY = [n for n, r in RECIPES.items() if r.expect is None]
FAULTY = [n for n, r in RECIPES.items() if r.expect is not None]


# ----------------------------------------------------------------------------- training


def _evaluate(model, recipe, valid, generator):
    model.eval()
    with torch.no_grad():
        if recipe.task == "chars":
            x, y = char_batch(valid, 64, 32, generator)
            out = model(x)
            loss = float(nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)))
            accuracy = float((out.argmax(-1) == y).float().mean())
        else:
            x, y = valid
            out = model(x)
            loss = float(nn.functional.mse_loss(out, y) if recipe.task == "regress" else
                         nn.functional.cross_entropy(out, y))
            accuracy = None if recipe.task == "regress" else float((out.argmax(1) == y).float().mean())
    model.train()
    return loss, accuracy


def train(name, seed=0, steps=None, economy=False, samples=None, log=None, recipe=None):
    """Train recipe ``name`` under a Cockpit; returns ``(cockpit, summary)`` (summary: first/last loss, held-out).

    ``economy``: also track ``configuration("economy")`` (whose ``NormTest`` the
    ``noise_dominates`` rule reads); ``samples``: ``Cockpit(samples=...)`` (not for the
    recipes that accumulate gradients, where it is refused: those run exact); ``log``: the
    Cockpit's JSON-lines log; ``recipe``: a ``Recipe`` to train instead of ``RECIPES[name]``."""
    import cockpit_lite

    recipe = recipe or RECIPES[name]
    torch.manual_seed(seed)
    model, data, make_optimizer = recipe.build(seed)
    optimizer = make_optimizer(model.parameters())
    total = steps or recipe.steps
    scheduler = recipe.schedule(optimizer, total) if recipe.schedule else None
    quantities = (recipe.quantities() if recipe.quantities else []) + (
        cockpit_lite.configuration("economy") if economy else [])
    cp = cockpit_lite.Cockpit(model, quantities=quantities or None, accumulate=recipe.accumulate > 1,
                              samples=samples if recipe.accumulate == 1 else None, log=log)
    generator = torch.Generator().manual_seed(seed + 3)
    train_data, valid = data
    losses = []

    def batch():
        if recipe.task == "chars":
            return char_batch(train_data, recipe.batch, 32, generator)
        x, y = train_data
        index = torch.randint(0, len(x), (recipe.batch,), generator=generator)
        return x[index], y[index]

    def loss_of(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16):
            out = model(x)
        if recipe.task == "chars":
            return recipe.loss(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
        return recipe.loss(out.float(), y)

    for step in range(total):
        if recipe.zero_grad:
            optimizer.zero_grad()
        for k in range(recipe.accumulate):
            x, y = batch()
            loss = loss_of(x, y) / recipe.accumulate
            if recipe.loss_scale is not None:
                loss = loss * recipe.loss_scale(step)
            with cp(step, info={"loss": loss, "optimizer": optimizer}):  # every micro-batch (accumulate=True)
                loss.backward()
        losses.append(float(loss.detach()) * recipe.accumulate)
        if recipe.loss_scale is not None:  # what a clipped update of the unscaled loss would do
            scale = recipe.loss_scale(step)
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(max(1.0, scale))
        if recipe.clip:
            nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if recipe.log_every and step % recipe.log_every == 0:
            held_loss, held_accuracy = _evaluate(model, recipe, valid, generator)
            slots = {"valid": (held_loss, None, held_accuracy, None), "test": (None, held_loss, None, held_accuracy)}
            valid_loss, test_loss, valid_accuracy, test_accuracy = slots[recipe.log_slot]
            cp.log(step, step // 20, losses[-1], valid_loss, test_loss, None, valid_accuracy, test_accuracy,
                   optimizer.param_groups[0]["lr"])
    cp.close()
    held_loss, held_accuracy = _evaluate(model, recipe, valid, generator)
    finite = [v for v in losses if math.isfinite(v)]
    summary = {"first": finite[0] if finite else math.nan, "last": min(finite[-5:]) if finite else math.nan,
               "held_loss": held_loss, "held_accuracy": held_accuracy}
    return cp, summary


def outcome(name, cp, steps=None):
    """``(passed, first step of the expected finding or None)``.

    Faulty: the expected kind (and layer) found by ``onset + max(30, 20 % of the steps)``.
    Healthy: no finding of severity ``warning`` or ``error``.
    """
    recipe = RECIPES[name]
    findings = cp.findings
    if recipe.expect is None:
        return not [f for f in findings if f.severity in ("warning", "error")], None
    kind, layer = recipe.expect
    hits = [f for f in findings if f.kind == kind and (layer is None or f.layer == layer)]
    first = hits[0].step if hits else None
    onset = recipe.onset(cp.get_output()) if callable(recipe.onset) else recipe.onset
    deadline = onset + max(30, 0.2 * (steps or recipe.steps))
    return bool(hits) and first <= deadline, first


def spread(cp):
    """The statistics the thresholds cut, measured on one run (for calibrating on healthy runs).

    ``spike``: largest 7-record median loss / L₀; ``rise3``: largest 3-record median loss / L₀ over
    the first 20 records; ``peak_update3``: largest 3-step median ‖Δθ‖/‖θ‖; ``growth``: largest total ‖g‖ / its early level
    (median of the first 3 records); ``input_to_output``: largest min r(first two) / max r(last two)
    (tiny tensors left out); ``update``: smallest and largest 5-record median ‖Δθ‖/‖θ‖.
    """
    import statistics

    from cockpit_lite.diagnosis.history import History, rss

    record = cp.get_output()
    history = History(cp.names, [tuple(p.shape) for p in cp.params])
    losses, norms, relative = [], [], []
    for step in sorted(record):
        entry = record[step]
        history.update(step, entry)
        if "Loss" in entry and entry["Loss"] is not None and math.isfinite(entry["Loss"]):
            losses.append(entry["Loss"])
        grads = entry.get("GradNorm")
        if grads is not None and math.isfinite(rss(grads)):
            norms.append(rss(grads))
        ratios = history.relative_gradients(entry)
        if ratios and len(ratios) >= 2:
            first = min(ratios[0][1], ratios[1][1]) if len(ratios) >= 4 else ratios[0][1]
            ref = max(r for _, r in ratios[-2:])
            if ref > 0:
                relative.append(first / ref)
    ref = statistics.median(losses[:3]) if losses else math.nan
    spikes = [statistics.median(losses[i - 7:i]) / ref for i in range(7, len(losses) + 1)] or [math.nan]
    early = statistics.median(norms[:3]) if norms else math.nan
    updates = [statistics.median(r for _, r in history.ratios[i - 5:i]) for i in range(5, len(history.ratios) + 1)]
    rises = [statistics.median(losses[i - 3:i]) / ref for i in range(3, min(len(losses), 20) + 1)] or [math.nan]
    peaks = [statistics.median(r for _, r in history.ratios[i - 3:i]) for i in range(3, len(history.ratios) + 1)]
    return {"spike": max(spikes), "rise3": max(rises), "peak_update3": max(peaks, default=math.nan),
            "growth": max(n / early for n in norms) if norms else math.nan,
            "input_to_output": max(relative, default=math.nan),
            "update_min": min(updates, default=math.nan), "update_max": max(updates, default=math.nan)}


def compare_samples(names, k, seeds, steps=None):
    """Findings ``{(kind, layer)}`` of each recipe and seed, exact and with ``samples=k`` (economy
    tracked in both); returns the list of ``(name, seed, exact, subsampled)`` that differ."""
    differ = []
    for name in names:
        for seed in range(seeds):
            found = [{(f.kind, f.layer) for f in train(name, seed, steps, economy=True, samples=s)[0].findings}
                     for s in (None, k)]
            same = found[0] == found[1]
            print(f"{name} seed {seed}: {'same' if same else 'DIFFERENT'}  exact {sorted(map(str, found[0])) or '-'}"
                  + ("" if same else f"  samples={k} {sorted(map(str, found[1])) or '-'}"), flush=True)
            if not same:
                differ.append((name, seed, found[0], found[1]))
    print(f"\n{len(differ)} of {len(names) * seeds} runs differ in their findings with samples={k}")
    return differ


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.realistic_diagnosis",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(RECIPES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--compare-samples", type=int, metavar="K",
                        help="instead: track configuration('economy') too and compare the findings (kind, layer) "
                             "of each recipe's exact run with those of Cockpit(samples=K)")
    args = parser.parse_args(argv)
    single_thread()
    import logging

    logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.ERROR + 10)
    if args.compare_samples:
        return compare_samples(args.only or list(RECIPES), args.compare_samples, args.seeds, args.steps)
    rows, spreads = [], []
    for name in args.only or RECIPES:
        recipe = RECIPES[name]
        for seed in range(args.seeds):
            start = time.perf_counter()
            cp, summary = train(name, seed=seed, steps=args.steps)
            passed, first = outcome(name, cp, args.steps)
            expect = "healthy" if recipe.expect is None else f"{recipe.expect[0]} [{recipe.expect[1]}]"
            kinds = ", ".join(f"{f.kind}@{f.step}" + (f"[{f.layer}]" if f.layer is not None else "")
                              + ("" if f.severity != "info" else "(info)") for f in cp.findings)
            accuracy = summary["held_accuracy"]
            held = f"held-out {summary['held_loss']:.3g}" + ("" if accuracy is None else f" / {100 * accuracy:.0f}%")
            verdict = "ok" if passed else "MISSED" if recipe.expect else "FALSE ALARM"
            print(f"{name} seed {seed} ({expect}; {recipe.note}; {time.perf_counter() - start:.1f} s; loss "
                  f"{summary['first']:.3g} -> {summary['last']:.3g}, {held}): {verdict}  {kinds or '-'}")
            rows.append((name, seed, recipe.expect, passed))
            if recipe.expect is None:
                stats = spread(cp)
                spreads.append(stats)
                print("    spread: " + ", ".join(f"{k} {v:.3g}" for k, v in stats.items()))
    faulty = [r for r in rows if r[2] is not None]
    healthy = [r for r in rows if r[2] is None]
    print(f"\nfaulty runs found: {sum(r[3] for r in faulty)}/{len(faulty)}; "
          f"healthy runs without warning/error: {sum(r[3] for r in healthy)}/{len(healthy)}")
    if spreads:
        print("healthy spread over all recipes and seeds: " + ", ".join(
            f"{k} {min(s[k] for s in spreads):.3g} .. {max(s[k] for s in spreads):.3g}" for k in spreads[0]))
    return rows


if __name__ == "__main__":
    main()
