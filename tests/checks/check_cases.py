"""The pre-flight checks' test suite: healthy controls and cases with one realistic bug each.

``CASES[name]()`` builds a ``Case``: the arguments of ``checks.run`` and the exact
set of checks that must fail (empty for a healthy control). Every model is
small (digits from scikit-learn, or synthetic data), so a whole ``run`` takes
well under a second or two on one thread.
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


def digits(scaling="unit"):
    """``(train, test)`` digit images ``[N, 1, 8, 8]`` and labels."""
    return common.load_digits_tensors(0, scaling=scaling)


def digits_data(train, test):
    return {"x_train": train[0], "y_train": train[1], "x_test": test[0], "y_test": test[1]}


def digits_case(model, bug="", expected=(), scaling="unit", data_edit=None, **options):
    train, test = digits(scaling)
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


def lm_case(model, bug="", expected=()):
    return Case(model, lm_loss, tokens(), {"task": "causal_lm", "num_classes": VOCAB}, frozenset(expected), bug)


# ---------------------------------------------------------------- models


def seeded(build):
    """``build()`` under a fixed seed (the same initial weights in every test)."""
    def wrapper(*args, **kwargs):
        torch.manual_seed(0)
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

    def __init__(self, mask="causal"):
        super().__init__()
        self.mask = mask
        self.embed = nn.Embedding(VOCAB, 32)
        self.position = nn.Embedding(SEQ, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, VOCAB)

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

HEALTHY = {
    "digits_mlp": lambda: digits_case(mlp()),
    "bn_cnn": lambda: digits_case(bn_cnn()),
    "lstm_classifier": lambda: digits_case(seeded(RowLSTM)()),
    "causal_transformer": lambda: lm_case(seeded(CausalTransformer)()),
    "lstm_lm": lambda: lm_case(seeded(LSTMLanguageModel)()),
    "regression_mlp": lambda: regression_case(),
}


@seeded
def regression_case(bug="", expected=(), scale=1.0):
    z = torch.randn(256, 6)
    x, y = z * scale, z[:, :3].sin().sum(1, keepdim=True) + 0.1 * z[:, 3:4]
    model = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 1))
    data = {"x_train": x[:200], "y_train": y[:200], "x_test": x[200:], "y_test": y[200:]}
    return Case(model, nn.MSELoss(), (x[:32], y[:32]), {"task": "regression", "data": data},
                frozenset(expected), bug)


def _duplicate_test_rows(data):
    data["x_test"] = torch.cat([data["x_train"][:20], data["x_test"][20:]])  # BUG: test rows from train


def _imbalanced(data):
    keep = (data["y_train"] == 0) | (torch.arange(len(data["y_train"])) % 20 == 0)  # BUG: subsampled wrongly
    data["x_train"], data["y_train"] = data["x_train"][keep], data["y_train"][keep]


def _nan_pixel(data):
    data["x_train"] = data["x_train"].clone()
    data["x_train"][5, 0, 3, 3] = float("nan")  # BUG: a NaN from a failed division


BROKEN = {
    "softmax_before_ce": lambda: digits_case(
        nn.Sequential(mlp(), nn.Softmax(dim=1)), "softmax before CrossEntropyLoss",
        {"overfit_one_batch"}),
    "huge_init": lambda: digits_case(huge_init_mlp(), "weights drawn with std 1", {"init_loss", "init_calibration"}),
    "batch_mixing": lambda: digits_case(
        nn.Sequential(CenterBatch(), mlp()), "x - x.mean(0)",
        {"batch_independence_forward", "batch_independence_backward"}),
    "lstm_view_for_transpose": lambda: digits_case(
        seeded(RowLSTM)(time_major_bug=True), "view(T, B, F) instead of transpose(0, 1)",
        {"batch_independence_forward", "batch_independence_backward", "input_independent_baseline"}),
    "missing_causal_mask": lambda: lm_case(
        seeded(CausalTransformer)(mask=None), "no attention mask", {"causal_forward", "causal_backward"}),
    "mask_off_by_one": lambda: lm_case(
        seeded(CausalTransformer)(mask="off_by_one"), "triu(2) instead of triu(1)",
        {"causal_forward", "causal_backward"}),
    "bidirectional_lm": lambda: lm_case(
        seeded(LSTMLanguageModel)(bidirectional=True), "bidirectional=True in a language model",
        {"causal_forward", "causal_backward"}),
    "detached_layer": lambda: digits_case(seeded(Detached)(), "features .detach()ed",
                                          {"gradient_check", "nonzero_gradients", "overfit_one_batch"}),
    "frozen_layer": lambda: digits_case(frozen_mlp(), "requires_grad_(False) on the first layer",
                                        {"nonzero_gradients", "overfit_one_batch"}),
    "ignores_input": lambda: digits_case(
        seeded(IgnoresInput)(), "forward uses a buffer instead of x",
        {"input_independent_baseline", "nonzero_gradients", "overfit_one_batch"}),
    "wrong_backward": lambda: digits_case(
        seeded(lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 32), CustomReLU(), nn.Linear(32, 10)))(),
        "custom ReLU backward without the mask", {"gradient_check"}),
    "raw_0_255_inputs": lambda: digits_case(mlp(), "pixels on 0..255", {"data_normalization", "init_loss",
                                                                         "init_calibration"}, scaling="raw255"),
    "duplicated_test_rows": lambda: digits_case(mlp(), "20 test rows copied from train", {"data_duplicates"},
                                                data_edit=_duplicate_test_rows),
    "imbalanced_labels": lambda: digits_case(mlp(), "training split subsampled wrongly", {"data_imbalance"},
                                             data_edit=_imbalanced),
    "nan_in_inputs": lambda: digits_case(mlp(), "one NaN pixel", {"data_nonfinite"}, data_edit=_nan_pixel),
    "unscaled_regression_inputs": lambda: regression_case("inputs in units of 1000", {"data_normalization"},
                                                          scale=1000.0),
}

CASES = {**HEALTHY, **BROKEN}
