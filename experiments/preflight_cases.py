"""The pre-flight checks' set-ups: healthy controls and cases with one realistic bug each.

``CASES[name](seed=0)`` builds a ``Case``: the arguments of ``checks.run`` and the exact
set of checks that must fail (empty for a healthy control); ``seed`` draws the
initialisation, the split and the batch. Every model is small (digits from
scikit-learn, text of Python's own sources, or synthetic data), so a whole ``run``
takes a second or two on one thread. ``tests/checks`` runs every case on seed 0;
``python -m experiments.preflight --calibrate`` runs them on several seeds and
prints the healthy and the faulty spread of every check's value.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from experiments import common

VOCAB, SEQ = 24, 10


@dataclass
class Case:
    model: nn.Module
    loss_fn: object
    batch: tuple
    options: dict = field(default_factory=dict)
    expected: frozenset = frozenset()  # names of the checks that must fail, exactly
    bug: str = ""  # the one-line bug, in words (empty: healthy)


# ---------------------------------------------------------------- data


def digits(scaling="unit", seed=0):
    """``(train, test)`` digit images ``[N, 1, 8, 8]`` and labels (``seed``: the split)."""
    return common.load_digits_tensors(seed, scaling=scaling)


def digits_data(train, test):
    return {"x_train": train[0], "y_train": train[1], "x_test": test[0], "y_test": test[1]}


def digits_case(model, bug="", expected=(), scaling="unit", data_edit=None, seed=0, **options):
    train, test = digits(scaling, seed)
    data = digits_data(train, test)
    if data_edit is not None:
        data_edit(data)
    return Case(model, nn.CrossEntropyLoss(), (train[0][:64], train[1][:64]),
                {"task": "classification", "num_classes": 10, "data": data, **options}, frozenset(expected), bug)


def tokens(batch=8, length=SEQ, seed=0):
    """Random token sequences and their next-token targets (``y[:, t] = x[:, t + 1]``)."""
    stream = torch.randint(0, VOCAB, (batch, length + 1), generator=torch.Generator().manual_seed(seed))
    return stream[:, :-1], stream[:, 1:]


def lm_loss(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def lm_case(model, bug="", expected=(), seed=0):
    return Case(model, lm_loss, tokens(seed=seed), {"task": "causal_lm", "num_classes": VOCAB}, frozenset(expected),
                bug)


# ---------------------------------------------------------------- models


def seeded(build):
    """``build(..., seed=0)``: ``build()`` under ``torch.manual_seed(seed)`` (the same initial weights for a seed)."""
    def wrapper(*args, seed=0, **kwargs):
        torch.manual_seed(seed)
        return build(*args, **kwargs)
    return wrapper


@seeded
def mlp():
    return common.mlp([32])


@seeded
def bn_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
    )


class RowLSTM(nn.Module):
    """Reads a digit image row by row (8 steps of 8 pixels) and classifies the last hidden state."""

    def __init__(self, time_major_bug=False):
        super().__init__()
        self.time_major_bug = time_major_bug
        self.lstm = nn.LSTM(8, 32, batch_first=not time_major_bug)
        self.head = nn.Linear(32, 10)

    def forward(self, images):
        rows = images.flatten(1, 2)  # (B, 8 rows, 8 pixels)
        if self.time_major_bug:  # BUG: view instead of transpose for a time-major LSTM
            out, _ = self.lstm(rows.view(rows.shape[1], rows.shape[0], -1))
            return self.head(out[-1])
        out, _ = self.lstm(rows)
        return self.head(out[:, -1])


class CausalTransformer(nn.Module):
    """Token embedding + learned positions + causal TransformerEncoder + LM head."""

    def __init__(self, mask="causal", vocab=VOCAB, length=SEQ):
        super().__init__()
        self.mask = mask
        self.embed = nn.Embedding(vocab, 32)
        self.position = nn.Embedding(length, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, vocab)

    def forward(self, ids):
        length = ids.shape[1]
        h = self.embed(ids) + self.position(torch.arange(length, device=ids.device))
        if self.mask == "causal":
            mask = nn.Transformer.generate_square_subsequent_mask(length)
        elif self.mask == "off_by_one":  # BUG: diagonal=2 lets position t see t + 1
            mask = torch.full((length, length), float("-inf")).triu(2)
        else:  # BUG: the mask is never built
            mask = None
        return self.head(self.norm(self.encoder(h, mask=mask)))


class LSTMLanguageModel(nn.Module):
    def __init__(self, bidirectional=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.lstm = nn.LSTM(32, 32, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(64 if bidirectional else 32, VOCAB)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


class CenterBatch(nn.Module):
    """BUG: centres over the batch axis (x - x.mean(0)) instead of per sample."""

    def forward(self, x):
        return x - x.mean(0)


class Detached(nn.Module):
    """An MLP whose hidden features are detached by mistake."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.body(x).detach())  # BUG: .detach()


class IgnoresInput(nn.Module):
    """An MLP that is fed the wrong tensor."""

    def __init__(self):
        super().__init__()
        self.net = common.mlp([32])
        self.register_buffer("template", torch.zeros(1, 1, 8, 8))

    def forward(self, x):
        return self.net(self.template.expand_as(x))  # BUG: should be self.net(x)


class LeakyGradReLU(torch.autograd.Function):
    """A custom ReLU whose backward forgets the mask."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp_min(0)

    @staticmethod
    def backward(ctx, grad):
        return grad  # BUG: should be grad * (x > 0)


class CustomReLU(nn.Module):
    def forward(self, x):
        return LeakyGradReLU.apply(x)


@seeded
def huge_init_mlp():
    model = common.mlp([32])
    for p in model.parameters():
        nn.init.normal_(p, std=1.0)  # BUG: std 1 instead of ~1/sqrt(fan_in)
    return model


@seeded
def frozen_mlp():
    model = common.mlp([32])
    model[1].requires_grad_(False)  # BUG: meant model[1] to stay trainable
    return model


# ---------------------------------------------------------------- the suite


@seeded
def regression_case(bug="", expected=(), scale=1.0, features=6, outputs=1):
    z = torch.randn(256, features)
    x, y = z * scale, z[:, :3].sin().sum(1, keepdim=True).repeat(1, outputs) + 0.1 * z[:, 3:3 + outputs]
    model = nn.Sequential(nn.Linear(features, 64), nn.Tanh(), nn.Linear(64, outputs))
    data = {"x_train": x[:200], "y_train": y[:200], "x_test": x[200:], "y_test": y[200:]}
    return Case(model, nn.MSELoss(), (x[:32], y[:32]), {"task": "regression", "data": data},
                frozenset(expected), bug)


def text_lm_case(seed=0, batch=16, length=32):
    """A causal transformer on characters of Python's own sources (``realistic_diagnosis.text``)."""
    from experiments.realistic_diagnosis import char_batch, char_data

    train, _, vocab = char_data(seed)
    x, y = char_batch(train, batch, length, torch.Generator().manual_seed(seed))
    model = seeded(CausalTransformer)(vocab=vocab, length=length, seed=seed)
    return Case(model, lm_loss, (x, y), {"task": "causal_lm", "num_classes": vocab})


def natural_imbalance_case(seed=0, share=0.85):
    """Digits where ``share`` of the labels of both splits are class 0 (the data is imbalanced, not the split)."""
    case = digits_case(mlp(seed=seed), seed=seed)
    data = case.options["data"]
    for split in ("train", "test"):
        x, y = data[f"x_{split}"], data[f"y_{split}"]
        others, zeros = (y != 0).nonzero().flatten(), (y == 0).nonzero().flatten()
        keep = torch.cat([zeros, others[: int(len(zeros) * (1 - share) / share)]])
        keep = keep[torch.randperm(len(keep), generator=torch.Generator().manual_seed(seed))]
        data[f"x_{split}"], data[f"y_{split}"] = x[keep], y[keep]
    case.batch = (data["x_train"][:64], data["y_train"][:64])
    return case


def small_data_case(seed=0, train=48, test=32):
    """Digits with ``train`` training and ``test`` held-out images (the batch is the training set)."""
    case = digits_case(mlp(seed=seed), seed=seed)
    data = case.options["data"]
    data["x_train"], data["y_train"] = data["x_train"][:train], data["y_train"][:train]
    data["x_test"], data["y_test"] = data["x_test"][:test], data["y_test"][:test]
    case.batch = (data["x_train"], data["y_train"])
    return case


def _vit(seed=0):
    from experiments.realistic_diagnosis import TinyViT

    return seeded(TinyViT)(seed=seed)


def _resnet(seed=0):
    from experiments.realistic_diagnosis import resnet

    return seeded(resnet)(seed=seed)


HEALTHY = {
    "digits_mlp": lambda seed=0: digits_case(mlp(seed=seed), seed=seed),
    "bn_cnn": lambda seed=0: digits_case(bn_cnn(seed=seed), seed=seed),
    "resnet_bn": lambda seed=0: digits_case(_resnet(seed), seed=seed),
    "vit": lambda seed=0: digits_case(_vit(seed), seed=seed, scaling="standard"),
    "lstm_classifier": lambda seed=0: digits_case(seeded(RowLSTM)(seed=seed), seed=seed),
    "causal_transformer": lambda seed=0: lm_case(seeded(CausalTransformer)(seed=seed), seed=seed),
    "lstm_lm": lambda seed=0: lm_case(seeded(LSTMLanguageModel)(seed=seed), seed=seed),
    "text_lm": text_lm_case,
    "regression_mlp": lambda seed=0: regression_case(seed=seed),
    "regression_wide": lambda seed=0: regression_case(features=20, outputs=4, seed=seed),
    "natural_imbalance": natural_imbalance_case,
    "small_data": small_data_case,
}


def _duplicate_test_rows(data):
    data["x_test"] = torch.cat([data["x_train"][:20], data["x_test"][20:]])  # BUG: test rows from train


def _imbalanced(data):
    keep = (data["y_train"] == 0) | (torch.arange(len(data["y_train"])) % 20 == 0)  # BUG: subsampled wrongly
    data["x_train"], data["y_train"] = data["x_train"][keep], data["y_train"][keep]


def _nan_pixel(data):
    data["x_train"] = data["x_train"].clone()
    data["x_train"][5, 0, 3, 3] = float("nan")  # BUG: a NaN from a failed division


BROKEN = {
    "softmax_before_ce": lambda seed=0: digits_case(
        nn.Sequential(mlp(seed=seed), nn.Softmax(dim=1)), "softmax before CrossEntropyLoss",
        {"overfit_one_batch"}, seed=seed),
    "huge_init": lambda seed=0: digits_case(huge_init_mlp(seed=seed), "weights drawn with std 1",
                                            {"init_loss", "init_calibration"}, seed=seed),
    "batch_mixing": lambda seed=0: digits_case(
        nn.Sequential(CenterBatch(), mlp(seed=seed)), "x - x.mean(0)",
        {"batch_independence_forward", "batch_independence_backward"}, seed=seed),
    "lstm_view_for_transpose": lambda seed=0: digits_case(
        seeded(RowLSTM)(time_major_bug=True, seed=seed), "view(T, B, F) instead of transpose(0, 1)",
        {"batch_independence_forward", "batch_independence_backward", "input_independent_baseline"}, seed=seed),
    "missing_causal_mask": lambda seed=0: lm_case(
        seeded(CausalTransformer)(mask=None, seed=seed), "no attention mask", {"causal_forward", "causal_backward"},
        seed=seed),
    "mask_off_by_one": lambda seed=0: lm_case(
        seeded(CausalTransformer)(mask="off_by_one", seed=seed), "triu(2) instead of triu(1)",
        {"causal_forward", "causal_backward"}, seed=seed),
    "bidirectional_lm": lambda seed=0: lm_case(
        seeded(LSTMLanguageModel)(bidirectional=True, seed=seed), "bidirectional=True in a language model",
        {"causal_forward", "causal_backward"}, seed=seed),
    "detached_layer": lambda seed=0: digits_case(seeded(Detached)(seed=seed), "features .detach()ed",
                                                 {"gradient_check", "nonzero_gradients", "overfit_one_batch"},
                                                 seed=seed),
    "frozen_layer": lambda seed=0: digits_case(frozen_mlp(seed=seed), "requires_grad_(False) on the first layer",
                                               {"nonzero_gradients", "overfit_one_batch"}, seed=seed),
    "ignores_input": lambda seed=0: digits_case(
        seeded(IgnoresInput)(seed=seed), "forward uses a buffer instead of x",
        {"input_independent_baseline", "nonzero_gradients", "overfit_one_batch"}, seed=seed),
    "wrong_backward": lambda seed=0: digits_case(
        seeded(lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 32), CustomReLU(), nn.Linear(32, 10)))(seed=seed),
        "custom ReLU backward without the mask", {"gradient_check"}, seed=seed),
    "raw_0_255_inputs": lambda seed=0: digits_case(mlp(seed=seed), "pixels on 0..255",
                                                   {"data_normalization", "init_loss", "init_calibration"},
                                                   scaling="raw255", seed=seed),
    "duplicated_test_rows": lambda seed=0: digits_case(mlp(seed=seed), "20 test rows copied from train",
                                                       {"data_duplicates"}, data_edit=_duplicate_test_rows, seed=seed),
    "imbalanced_labels": lambda seed=0: digits_case(mlp(seed=seed), "training split subsampled wrongly",
                                                    {"data_imbalance"}, data_edit=_imbalanced, seed=seed),
    "nan_in_inputs": lambda seed=0: digits_case(mlp(seed=seed), "one NaN pixel", {"data_nonfinite"},
                                                data_edit=_nan_pixel, seed=seed),
    "unscaled_regression_inputs": lambda seed=0: regression_case("inputs in units of 1000", {"data_normalization"},
                                                                 scale=1000.0, seed=seed),
}

CASES = {**HEALTHY, **BROKEN}
