"""Classic broken training set-ups next to healthy twins, each diagnosed live.

``python -m experiments.broken_networks`` trains every scenario of ``SCENARIOS`` on
scikit-learn's digits or synthetic data (a few seconds each, one CPU thread), prints
its findings and writes one dashboard per run (with the findings panel) plus its
JSON-lines log to ``runs/broken_networks/``. ``--only NAME ...`` picks scenarios,
``--seed`` varies initialisation and batches, ``--steps`` shortens every run.

Each scenario is one realistic mistake (or none): ``expect`` is the finding kind it
must raise and the layer it must name (``None`` for run- or data-level kinds), or
``None`` for a healthy run, which must raise nothing. ``tests/diagnosis`` runs the
same suite.
"""

import argparse
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from experiments.common import kaiming, load_digits_tensors, mlp, single_thread


# ----------------------------------------------------------------------------- data


def digits(seed, scaling="unit", shuffle_labels=False, binary=False, nan_rows=0.0, subset=None):
    """Digits as ``((x, y) train, (x, y) valid)``: images [N, 1, 8, 8]."""
    (x, y), (xv, yv) = load_digits_tensors(seed=seed, scaling=scaling)
    g = torch.Generator().manual_seed(seed + 1)
    if shuffle_labels:
        y = y[torch.randperm(len(y), generator=g)]
    if binary:
        y, yv = (y >= 5).float(), (yv >= 5).float()
    if nan_rows:
        rows = torch.rand(len(x), generator=g) < nan_rows
        x = x.clone()
        x[rows, 0, 3, 3] = float("nan")
    if subset:
        x, y = x[:subset], y[:subset]
    return (x, y), (xv, yv)


def synthetic(seed, n=1024, features=16, classes=5, offset=0.0, regression=False, noise=0.0):
    """Gaussian features, labels from a random linear teacher (classes, or a noisy regression target)."""
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, 1 if regression else classes, generator=g)
    if regression:
        y = x @ teacher + noise * torch.randn(n, 1, generator=g)
    else:
        y = (x @ teacher).argmax(1)
    x = x + offset
    cut = int(0.8 * n)
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


# ----------------------------------------------------------------------------- models


def cnn(batchnorm=False, conv2_bias=None):
    layers = [nn.Conv2d(1, 8, 3, padding=1)]
    layers += [nn.BatchNorm2d(8)] if batchnorm else []
    layers += [nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1)]
    layers += [nn.BatchNorm2d(16)] if batchnorm else []
    layers += [nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 2 * 2, 10)]
    model = nn.Sequential(*layers)
    if conv2_bias is not None:
        conv2 = [m for m in model if isinstance(m, nn.Conv2d)][1]
        nn.init.constant_(conv2.bias, conv2_bias)
    return model


class RowTransformer(nn.Module):
    """The 8 rows of a digit as 8 tokens: embedding, one encoder layer (LayerNorm inside), pooled head."""

    def __init__(self, width=32):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.position = nn.Parameter(torch.zeros(8, width))
        self.encoder = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        tokens = self.embed(x.reshape(-1, 8, 8)) + self.position
        return self.head(self.norm(self.encoder(tokens)).mean(1))


class Lambda(nn.Module):
    """A custom module applying ``fn`` (the place where a hand-written op goes wrong)."""

    def __init__(self, fn, label):
        super().__init__()
        self.fn, self.label = fn, label

    def forward(self, x):
        return self.fn(x)

    def extra_repr(self):
        return self.label


class Detached(nn.Module):
    """A bug: the features of the first block are detached, so it never learns."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.block(x).detach())


def deep_batchnorm(depth, width=64):
    """Flatten, then ``depth`` Linear → BatchNorm → ReLU blocks and a head: no residual connections."""
    layers = [nn.Flatten(), nn.Linear(64, width)]
    for _ in range(depth):
        layers += [nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, width)]
    return nn.Sequential(*layers, nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 10))


def scaled(model, factor, index=None):
    """Multiply the weights of ``model``'s Linear layers (or only the ``index``-th) by ``factor``."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for i, layer in enumerate(linears):
            if index is None or i == index:
                layer.weight.mul_(factor)
    return model


def randn_init(model):
    """Every Linear weight drawn from N(0, 1) (``torch.randn``), biases 0: ~sqrt(fan_in) too large per layer."""
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, nn.Linear):
                layer.weight.normal_(0.0, 1.0)
                layer.bias.zero_()
    return model


def biased(model, index, value):
    """Set the bias of the ``index``-th Linear layer to ``value``."""
    layer = [m for m in model.modules() if isinstance(m, nn.Linear)][index]
    nn.init.constant_(layer.bias, value)
    return model


def handwritten_bce(logits, target, stable=False):
    """Binary cross-entropy written out by hand (``stable``: with the usual clamp)."""
    p = torch.sigmoid(logits.squeeze(1))
    if stable:
        p = p.clamp(1e-6, 1 - 1e-6)
    return -(target * torch.log(p) + (1 - target) * torch.log(1 - p)).mean()


def mse(output, target):
    return nn.functional.mse_loss(output, target)


# ----------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    """A training set-up. ``build(seed)`` returns ``(model, data, optimizer factory)``."""

    build: Callable
    expect: Optional[tuple] = None  # (kind, layer) or None: healthy
    loss: Callable = nn.functional.cross_entropy
    steps: int = 100
    batch: int = 32
    zero_grad: bool = True
    accumulate: int = 1
    clip: Optional[float] = None  # clip the gradient norm to this before each optimizer step
    log_every: Optional[int] = None
    quantities: Optional[str] = None  # "economy" or a callable returning a list
    note: str = ""
    also: tuple = field(default_factory=tuple)  # other kinds that are consequences, not false alarms


def sgd(lr, momentum=0.0):
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum)


def adam(lr):
    return lambda params: torch.optim.Adam(params, lr=lr)


def _eos_setup(seed):
    (x, y), valid = synthetic(seed, n=80, features=5, regression=True, noise=0.1)
    model = nn.Linear(5, 1)
    sharpness = 2 * torch.linalg.eigvalsh(torch.cat([x, torch.ones(len(x), 1)], 1).T
                                         @ torch.cat([x, torch.ones(len(x), 1)], 1) / len(x)).max().item()
    return model, ((x, y), valid), sgd(2.1 / sharpness)


def _hess_max_ev():
    from cockpit_lite.quantities import HessMaxEV

    return [HessMaxEV()]


SCENARIOS = {
    # -- learning rate
    "lr_too_high_sgd": Scenario(lambda s: (mlp([64]), digits(s), sgd(4.0)), ("lr_too_high", None),
                                note="SGD at 4.0 on an MLP"),
    "lr_too_high_adam_cnn": Scenario(lambda s: (cnn(), digits(s), adam(0.3)), ("lr_too_high", None),
                                     note="Adam at 0.3 on a CNN"),
    "lr_too_low_sgd": Scenario(lambda s: (mlp([64]), digits(s), sgd(1e-4)), ("lr_too_low", None),
                               note="SGD at 1e-4"),
    "lr_too_low_adam_cnn": Scenario(lambda s: (cnn(), digits(s), adam(1e-6)), ("lr_too_low", None),
                                    note="Adam at 1e-6 on a CNN"),
    # -- gradient flow
    "exploding_deep_batchnorm": Scenario(lambda s: (deep_batchnorm(32), digits(s, scaling="standard"), sgd(1e-3)),
                                         ("exploding_gradients", "1"),
                                         note="33 Linear+BatchNorm+ReLU blocks without residuals (Yang et al. 2019); "
                                              "the gradient is largest, relative to the weights, at the input end"),
    "vanishing_deep_sigmoid": Scenario(lambda s: (mlp([32] * 8, nn.Sigmoid), digits(s), sgd(0.1)),
                                       ("vanishing_gradients", "1"), note="9 layers with sigmoid",
                                       also=("lr_too_low",)),
    "vanishing_detach": Scenario(lambda s: (Detached(), digits(s), sgd(0.1)), ("vanishing_gradients", "block.1"),
                                 note="features detached after the first block"),
    "exploding_randn_relu_sgd": Scenario(lambda s: (randn_init(mlp([64] * 4)), digits(s), sgd(0.01)),
                                         ("exploding_gradients", None),
                                         note="4 ReLU layers with weights from torch.randn (std 1, not Kaiming)"),
    "exploding_randn_relu_adam": Scenario(lambda s: (randn_init(mlp([128] * 3)), digits(s, scaling="standard"),
                                                     adam(1e-3)), ("exploding_gradients", None),
                                          note="3 ReLU layers with weights from torch.randn, Adam"),
    # -- activations
    "dead_relu_bias": Scenario(lambda s: (biased(mlp([64, 64]), 1, -4.0), digits(s), sgd(0.1)),
                               ("dead_relu", "4"), note="second hidden layer's bias initialised at -4"),
    "dead_relu_cnn": Scenario(lambda s: (cnn(conv2_bias=-3.0), digits(s), adam(1e-3)), ("dead_relu", "4"),
                              note="second conv's bias initialised at -3"),
    "saturated_tanh": Scenario(lambda s: (scaled(mlp([64], nn.Tanh), 20.0, 0), digits(s), sgd(0.05)),
                               ("saturated_activations", "2"), note="tanh after weights 20x too large"),
    "saturated_sigmoid_synthetic": Scenario(
        lambda s: (scaled(mlp([32, 32], nn.Sigmoid, n_in=16, n_out=5), 30.0, 1), synthetic(s), adam(1e-3)),
        ("saturated_activations", "4"), note="sigmoid after weights 30x too large (synthetic data)"),
    # -- data
    "unnormalized_255": Scenario(lambda s: (mlp([64]), digits(s, scaling="raw255"), sgd(1e-3)),
                                 ("unnormalized_inputs", None), note="digits on a 0..255 scale",
                                 also=("lr_too_high", "exploding_gradients", "nan_loss")),
    "unnormalized_offset_synthetic": Scenario(
        lambda s: (mlp([32], n_in=16, n_out=5), synthetic(s, offset=40.0), adam(1e-3)),
        ("unnormalized_inputs", None), note="synthetic features with an offset of 40"),
    "shuffled_labels": Scenario(lambda s: (mlp([64]), digits(s, shuffle_labels=True), sgd(0.1)),
                                ("shuffled_labels", None), log_every=5, note="training labels permuted"),
    "nan_input": Scenario(lambda s: (mlp([64]), digits(s, nan_rows=0.05), sgd(0.1)), ("nan_loss", None),
                          note="5% of the images have a NaN pixel"),
    # -- loop
    "missing_zero_grad_sgd": Scenario(lambda s: (mlp([64]), digits(s), sgd(0.02)), ("missing_zero_grad", None),
                                      zero_grad=False, note="no optimizer.zero_grad()",
                                      also=("lr_too_high", "exploding_gradients")),
    "missing_zero_grad_adam_cnn": Scenario(lambda s: (cnn(), digits(s), adam(1e-3)), ("missing_zero_grad", None),
                                           zero_grad=False, note="no zero_grad, Adam on a CNN"),
    # -- non-finite values
    "nan_handwritten_bce": Scenario(lambda s: (scaled(mlp([32], n_out=1), 100.0, 1), digits(s, binary=True),
                                               sgd(0.1)), ("nan_loss", "loss_fn"),
                                    loss=handwritten_bce, note="BCE written with log(sigmoid), logits too large "
                                                               "(output weights 100x: 40x made no NaN on 4 of 8 seeds)"),
    "nan_div_custom": Scenario(lambda s: (nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(),
                                                        Lambda(lambda x: x / x[:, :1], "x / x[:, :1]"),
                                                        nn.Linear(32, 10)), digits(s), sgd(0.1)),
                               ("nan_loss", "3"), note="custom layer divides by a ReLU output"),
    "nan_sqrt_custom": Scenario(lambda s: (nn.Sequential(nn.Flatten(), nn.Linear(64, 32),
                                                         Lambda(torch.sqrt, "sqrt"), nn.Linear(32, 10)),
                                           digits(s), sgd(0.1)), ("nan_loss", "2"),
                                note="custom layer takes sqrt of a pre-activation"),
    "nan_exp_custom": Scenario(lambda s: (nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(),
                                                        Lambda(lambda x: torch.exp(400 * x), "exp(400 x)"),
                                                        nn.LayerNorm(32), nn.Linear(32, 10)),
                                          digits(s), sgd(0.1)), ("nan_loss", "3"),
                               note="custom layer exponentiates large features (LayerNorm after it)"),
    # -- noise, curvature, generalisation
    "noise_tiny_batch": Scenario(lambda s: (nn.Sequential(nn.Linear(16, 1)), synthetic(s, regression=True, noise=20.0),
                                            sgd(0.01)), ("noise_dominates", None), loss=mse, batch=2,
                                 quantities="economy", note="batch of 2 on noisy targets (economy)"),
    "edge_of_stability_gd": Scenario(_eos_setup, ("edge_of_stability", None), loss=mse, batch=64, steps=40,
                                     quantities=_hess_max_ev, note="full-batch GD at 2.1/lambda_max",
                                     also=("lr_too_high",)),
    "overfitting_small_data": Scenario(lambda s: (mlp([256, 256]), digits(s, subset=40), adam(3e-3)),
                                       ("overfitting", None), batch=40, steps=300, log_every=5,
                                       note="40 training images, a wide MLP, 300 steps"),
    # -- healthy controls
    "healthy_mlp_sgd": Scenario(lambda s: (mlp([64]), digits(s), sgd(0.1)), log_every=10),
    "healthy_tanh_adam": Scenario(lambda s: (mlp([64, 64], nn.Tanh), digits(s), adam(1e-3))),
    "healthy_cnn_adam": Scenario(lambda s: (cnn(), digits(s), adam(3e-3)), log_every=10),
    "healthy_cnn_batchnorm": Scenario(lambda s: (cnn(batchnorm=True), digits(s), sgd(0.05, 0.9))),
    "healthy_transformer": Scenario(lambda s: (RowTransformer(), digits(s, scaling="standard"), adam(1e-3))),
    "healthy_regression": Scenario(lambda s: (mlp([32], n_in=16, n_out=1), synthetic(s, regression=True, noise=0.1),
                                              adam(1e-2)), loss=mse),
    "healthy_economy_logged": Scenario(lambda s: (mlp([64]), digits(s), sgd(0.1)), batch=64, log_every=5,
                                       quantities="economy"),
    "healthy_bce_handwritten": Scenario(lambda s: (mlp([32], n_out=1), digits(s, binary=True), sgd(0.2)),
                                        loss=lambda z, t: handwritten_bce(z, t, stable=True)),
    "healthy_sigmoid_shallow": Scenario(lambda s: (mlp([32], nn.Sigmoid), digits(s), sgd(0.5))),
    "healthy_deep_relu_adam": Scenario(lambda s: (kaiming(mlp([64] * 6)), digits(s), adam(1e-3)), steps=300,
                                       log_every=10, note="7 ReLU layers (Kaiming init), Adam, 300 steps, held-out logged"),
    "healthy_deep_relu_sgd": Scenario(lambda s: (kaiming(mlp([128] * 5)), digits(s, scaling="standard"),
                                                 sgd(0.02, 0.9)), steps=300, log_every=10,
                                      note="6 ReLU layers (Kaiming init), SGD + momentum, held-out logged"),
    "healthy_accumulation": Scenario(lambda s: (mlp([64]), digits(s), sgd(0.1)), accumulate=2,
                                     note="gradient accumulation over 2 micro-batches, done right"),
}
"""name -> Scenario."""

HEALTHY = [name for name, s in SCENARIOS.items() if s.expect is None]
BROKEN = [name for name, s in SCENARIOS.items() if s.expect is not None]


# ----------------------------------------------------------------------------- training


def _evaluate(model, loss_fn, x, y):
    with torch.no_grad():
        out = model(x)
        loss = float(loss_fn(out, y))
        if out.shape[-1] == 1:
            accuracy = float(((out.squeeze(1) > 0).float() == y).float().mean()) if y.dim() == 1 else math.nan
        else:
            accuracy = float((out.argmax(1) == y).float().mean())
    return loss, accuracy


def train(name, seed=0, log=None, quantities=None, steps=None, diagnose=True, scenario=None):
    """Train scenario ``name`` with a Cockpit; returns the Cockpit (closed).

    Args:
        name: a key of ``SCENARIOS``.
        scenario: a ``Scenario`` to train instead of ``SCENARIOS[name]``.
        seed: initialisation, split and batch order.
        log: JSON-lines log path (optional).
        quantities: override the scenario's quantities (a list).
        steps: override the number of steps.
        diagnose: passed to the Cockpit.
    """
    import cockpit_lite
    from cockpit_lite import configuration

    scenario = scenario or SCENARIOS[name]
    torch.manual_seed(seed)
    model, ((x, y), (xv, yv)), make_optimizer = scenario.build(seed)
    optimizer = make_optimizer(model.parameters())
    if quantities is None:
        if scenario.quantities == "economy":
            quantities = configuration("economy")
        elif callable(scenario.quantities):
            quantities = scenario.quantities()
    cp = cockpit_lite.Cockpit(model, quantities=quantities, log=log, diagnose=diagnose)
    generator = torch.Generator().manual_seed(seed + 3)
    batch = min(scenario.batch, len(x))
    order, position = torch.randperm(len(x), generator=generator), 0
    total = steps or scenario.steps
    for step in range(total):
        if scenario.zero_grad and step % scenario.accumulate == 0:
            optimizer.zero_grad()
        if position + batch > len(x):
            order, position = torch.randperm(len(x), generator=generator), 0
        index = order[position:position + batch]
        position += batch
        loss = scenario.loss(model(x[index]), y[index])
        with cp(step, info={"loss": loss, "optimizer": optimizer}):
            loss.backward()
        if (step + 1) % scenario.accumulate == 0:
            if scenario.clip:
                nn.utils.clip_grad_norm_(model.parameters(), scenario.clip)
            optimizer.step()
        if scenario.log_every and step % scenario.log_every == 0:
            train_loss, train_accuracy = _evaluate(model, scenario.loss, x, y)
            valid_loss, valid_accuracy = _evaluate(model, scenario.loss, xv, yv)
            cp.log(step, step * batch // len(x), train_loss, valid_loss, None, train_accuracy, valid_accuracy,
                   None, optimizer.param_groups[0]["lr"])
    cp.close()
    return cp


def outcome(name, cp):
    """``(passed, first step of the expected finding or None, findings)`` of a trained scenario."""
    scenario = SCENARIOS[name]
    findings = cp.findings
    if scenario.expect is None:
        return not findings, None, findings
    kind, layer = scenario.expect
    hits = [f for f in findings if f.kind == kind and f.layer == layer]
    first = hits[0].step if hits else None
    return bool(hits) and first <= 0.2 * scenario.steps, first, findings


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.broken_networks", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join("runs", "broken_networks"))
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="scenarios to run (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-dashboards", action="store_true", help="skip the PNGs")
    parser.add_argument("--steps", type=int, help="train every scenario this many steps (a quick look; a finding "
                                                   "still counts only within 20%% of the scenario's own length)")
    args = parser.parse_args(argv)
    single_thread()
    os.makedirs(args.out, exist_ok=True)
    import logging

    logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.ERROR + 10)  # printed below instead
    rows = []
    for name in args.only or SCENARIOS:
        scenario = SCENARIOS[name]
        start = time.perf_counter()
        log = os.path.join(args.out, f"{name}.jsonl")
        cp = train(name, seed=args.seed, log=log, steps=args.steps)
        seconds = time.perf_counter() - start
        passed, first, findings = outcome(name, cp)
        expect = "healthy" if scenario.expect is None else f"{scenario.expect[0]} [{scenario.expect[1]}]"
        print(f"\n== {name} ({expect}; {scenario.note or 'healthy twin'}; {seconds:.1f} s): "
              f"{'OK' if passed else 'MISSED'}")
        for finding in findings:
            print(f"   {finding}")
        if not findings:
            print("   no findings")
        if not args.no_dashboards:
            from instruments import Dashboard

            Dashboard(title=f"{name}: {scenario.note or 'healthy'}").save(log, os.path.join(args.out, f"{name}.png"))
        rows.append((name, expect, passed, first, findings))
    print("\nscenario | expected | first detection | findings | result")
    for name, expect, passed, first, findings in rows:
        kinds = ", ".join(f"{f.kind}@{f.step}" + (f"[{f.layer}]" if f.layer is not None else "") for f in findings)
        print(f"{name} | {expect} | {first if first is not None else '-'} | {kinds or '-'} | "
              f"{'ok' if passed else 'MISSED'}")
    return rows


if __name__ == "__main__":
    main()
