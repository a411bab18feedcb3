"""The engine's GGN diagonal (``cockpit_lite.curvature.ggn``) against the brute-force ``Jᵀ (∇²_f L) J``.

Elementwise on every realistic model (``tests/models.py``, not BackPACK-extended: BatchNorm in
training mode, attention, tied weights, RNNs, dropout, custom layers) and loss function the engine
derives individual losses of, both reductions; the Monte-Carlo diagonal unbiased with honest
standard errors; training untouched; the refusals name the fix.
"""

import copy
import math

import pytest
import torch
from torch import nn

import models
import problems
from cockpit_lite import Cockpit
from cockpit_lite.curvature import ggn
from cockpit_lite.quantities import HessTrace, TICDiag
from cockpit_lite.quantities.base import Output
from cockpit_lite.quantities.curvature import CurvatureQuantity


class Diagonal(CurvatureQuantity):
    """A test quantity recording the curvature diagonal itself, per parameter (flattened)."""

    def parts(self, data, diagonal):
        return sum(d.sum() for d in diagonal), [d.reshape(-1) for d in diagonal]

    def package(self, total, layers, meta):
        return Output(total, [layer.tolist() for layer in layers], meta=meta)


def assert_diagonal(record, step, expected, blocks, rtol=1e-9):
    values = torch.cat([torch.tensor(v, dtype=torch.float64) for v in record[step]["layers"]["Diagonal"]])
    scale = expected.abs().max()
    torch.testing.assert_close(values, expected, rtol=rtol, atol=rtol * float(scale))


REALISTIC = [(name, 4, red) for name in models.REALISTIC for red in problems.REDUCTIONS]


@pytest.mark.parametrize("case", REALISTIC, ids=problems.case_id)
def test_exact_diagonal_matches_brute_force_on_realistic_models(case):
    problem = problems.make(*case, steps=2)
    cp, snapshots = problems.run(problem, [Diagonal(curvature="diag_ggn_exact")])
    record = cp.get_output()
    for step, snapshot in snapshots.items():
        assert_diagonal(record, step, problems.ggn(problem, snapshot).diagonal(), problems.layer_blocks(problem))
        assert record[step]["meta"]["Diagonal"]["curvature"] == "diag_ggn_exact"
        assert "flags" not in record[step]


class Conv(nn.Module):
    """Per-pixel class scores ``[B, C, H, W]`` (NLL over images, ``NllLoss2DBackward0``)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.norm = nn.GroupNorm(1, 3)

    def forward(self, x):
        return self.norm(self.conv(x)) * 2


def _mlp(outputs):
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.LayerNorm(5), nn.Linear(5, outputs))


def _sequence(outputs):
    return nn.Sequential(nn.Linear(4, 5), nn.GELU(), nn.Linear(5, outputs))


LOSSES = {
    # name: (model, input shape, loss(outputs, targets) of the mean/sum reduction, targets)
    "ce_weights_ignore_smoothing": (
        lambda: _mlp(4), (4,),
        lambda r: nn.CrossEntropyLoss(weight=torch.tensor([0.5, 1.0, 2.0, 1.5], dtype=torch.float64),
                                      ignore_index=1, label_smoothing=0.1, reduction=r),
        lambda g, b: torch.randint(0, 4, (b,), generator=g),
    ),
    "ce_images": (
        Conv, (2, 3, 3), lambda r: nn.CrossEntropyLoss(reduction=r),
        lambda g, b: torch.randint(0, 3, (b, 3, 3), generator=g),
    ),
    "nll_of_log_softmax": (
        lambda: nn.Sequential(_mlp(3), nn.LogSoftmax(dim=1)), (4,), lambda r: nn.NLLLoss(reduction=r),
        lambda g, b: torch.randint(0, 3, (b,), generator=g),
    ),
    "bce_multi_logit": (
        lambda: _mlp(3), (4,),
        lambda r: nn.BCEWithLogitsLoss(pos_weight=torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64), reduction=r),
        lambda g, b: torch.randint(0, 2, (b, 3), generator=g).double(),
    ),
    "huber": (
        lambda: _sequence(2), (3, 4), lambda r: nn.HuberLoss(delta=0.3, reduction=r),
        lambda g, b: torch.randn(b, 3, 2, generator=g, dtype=torch.float64),
    ),
    "smooth_l1": (
        lambda: _mlp(2), (4,), lambda r: nn.SmoothL1Loss(beta=0.5, reduction=r),
        lambda g, b: torch.randn(b, 2, generator=g, dtype=torch.float64),
    ),
    "mse_half": (
        lambda: _sequence(2), (3, 4), lambda r: (lambda f, y: 0.5 * nn.functional.mse_loss(f, y, reduction=r)),
        lambda g, b: torch.randn(b, 3, 2, generator=g, dtype=torch.float64),
    ),
}


@pytest.mark.parametrize("reduction", problems.REDUCTIONS)
@pytest.mark.parametrize("name", list(LOSSES))
def test_exact_diagonal_of_every_loss_function(name, reduction):
    """Class weights, ignore_index and label smoothing; per-pixel and per-position rows; a bare NLL
    after a log-softmax layer; multi-logit BCE with pos_weight; Huber and smooth L1 across their
    kinks; a constant factor: each against the brute force of its own loss (the log-softmax layer's:
    the GGN of the logits, as for cross-entropy)."""
    build, shape, loss_of, targets = LOSSES[name]
    torch.manual_seed(0)
    model, lossfunc = build().double(), loss_of(reduction)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, *shape, generator=g, dtype=torch.float64), targets(g, 5)
    if name == "ce_weights_ignore_smoothing":
        y[0] = 1  # an ignored sample
    cp = Cockpit(model, [Diagonal(curvature="diag_ggn_exact")], diagnose=False, strict=True)
    loss = lossfunc(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    if name == "nll_of_log_softmax":  # the split is at the logits: the loss is linear in the log-probabilities
        expected = problems.ggn_of(copy.deepcopy(model[0]), x, lambda f: nn.functional.cross_entropy(
            f, y, reduction=reduction)).diagonal()
    else:
        expected = problems.ggn_of(copy.deepcopy(model), x, lambda f: lossfunc(f, y)).diagonal()
    values = torch.cat([torch.tensor(v, dtype=torch.float64) for v in cp.get_output()[0]["layers"]["Diagonal"]])
    torch.testing.assert_close(values, expected, rtol=1e-9, atol=1e-9 * float(expected.abs().max()))


def test_monte_carlo_diagonal_is_unbiased_with_honest_standard_errors():
    """``diag_ggn_mc`` from the engine (the transformer: BackPACK cannot serve it): with 400 sampled
    labels the estimate is within 4 of its standard errors of the exact traces; over 24 seeds of 16
    draws the spread of the estimates matches the recorded standard errors (within a factor 1.6)."""
    problem = problems.make("transformer", 6, steps=1)
    many = HessTrace(curvature="diag_ggn_mc", probes=400)
    cp, snapshots = problems.run(problem, [many])
    snapshot = snapshots[0]
    diagonal = problems.ggn(problem, snapshot).diagonal()
    exact = torch.stack([diagonal[b].sum() for b in problems.layer_blocks(problem)])
    entry = cp.get_output()[0]
    meta = entry["meta"]["HessTrace"]
    assert (meta["curvature"], meta["probes"], meta["passes"], meta["df"]) == ("diag_ggn_mc", 400, 400, 15)
    values, se = torch.tensor(entry["HessTrace"]), torch.tensor(meta["layers_se"])
    assert ((values - exact).abs() <= 4 * se + 1e-12).all()
    estimates, errors = [], []
    for seed in range(24):
        rerun = problems.make("transformer", 6, steps=1)
        cp, _ = problems.run(rerun, [HessTrace(curvature="diag_ggn_mc", probes=16, seed=seed)])
        entry = cp.get_output()[0]
        estimates.append(sum(entry["HessTrace"]))
        errors.append(entry["meta"]["HessTrace"]["se"])
    spread, typical = torch.tensor(estimates).std(), torch.tensor(errors).pow(2).mean().sqrt()
    assert 1 / 1.6 < float(spread / typical) < 1.6
    assert abs(float(torch.tensor(estimates).mean() - exact.sum())) < 4 * float(spread) / math.sqrt(24)


MONTE_CARLO_STEP = """
import torch
from torch import nn
from cockpit_lite import Cockpit
from cockpit_lite.quantities import HessTrace
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
cp = Cockpit(model, [HessTrace(curvature="diag_ggn_mc", probes=2)], diagnose=False, strict=True)
x, y = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0])
loss = nn.functional.cross_entropy(model(x), y)
with cp(0, info={"loss": loss}):
    loss.backward()
print(cp.get_output()[0]["HessTrace"])
"""


def test_monte_carlo_draws_are_the_same_in_another_process(capsys):
    """The draws' generator is seeded from ``(seed, step)`` whatever the process's hash salt
    (PYTHONHASHSEED: Python's ``hash`` of a string changes with it): a process with another salt
    estimates the same diagonal, bit for bit."""
    import os
    import subprocess
    import sys

    salt = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    other = subprocess.run([sys.executable, "-c", MONTE_CARLO_STEP], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": salt}).stdout
    exec(MONTE_CARLO_STEP, {})
    assert capsys.readouterr().out == other

@pytest.mark.parametrize("name", ["transformer_dropout", "resnet_bn_train", "custom"])
def test_training_is_untouched_by_the_passes(name):
    """Three SGD-momentum steps with the engine's GGN passes (dropout, BatchNorm in training mode,
    a custom layer re-run by the generic rule): parameters and buffers bit-identical."""
    finals = []
    for tracked in (False, True):
        problem = problems.make(name, 4, steps=3)
        opt = torch.optim.SGD(problem.model.parameters(), lr=0.1, momentum=0.9)
        cp = Cockpit(problem.model, [TICDiag(), HessTrace(curvature="diag_ggn_exact")], diagnose=False) if tracked else None
        torch.manual_seed(3)
        for step, (x, y) in enumerate(problem.batches):
            opt.zero_grad()
            problems.backward(cp, step, problem.lossfunc(problem.model(x), y))
            opt.step()
        finals.append(({k: v.clone() for k, v in problem.model.state_dict().items()}, torch.get_rng_state()))
        if cp is not None:
            assert all(cp.get_output()[s]["meta"]["TICDiag"]["curvature"] == "diag_ggn_exact" for s in range(3))
    (plain, plain_rng), (watched, watched_rng) = finals
    assert all(torch.equal(plain[k], watched[k]) for k in plain)
    assert torch.equal(plain_rng, watched_rng)


def test_parameters_only_cockpit_finds_the_model():
    """``Cockpit(model.parameters())`` (Cockpit's recipe) on a ResNet with GroupNorm: the engine
    finds the model in the first watched forward pass, and the diagonal is exact from step 0."""
    problem = problems.make("resnet_gn", 3, steps=2)
    cp, snapshots = problems.run(problem, [Diagonal(curvature="diag_ggn_exact")], params_only=True)
    for step, snapshot in snapshots.items():
        assert_diagonal(cp.get_output(), step, problems.ggn(problem, snapshot).diagonal(), None)


def test_an_nll_of_no_log_softmax_is_refused_naming_the_fix():
    """NLL on inputs that are not log-probabilities of logits (the loss is linear in them: its
    curvature in the model's outputs is unknown): an explicit GGN curvature is refused before the
    backward pass naming the fix, "auto" gives a TIC of NaN with the reason."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Softmax(dim=1)).double()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 3])
    cp = Cockpit(model, [HessTrace(curvature="diag_ggn_exact")], diagnose=False)
    loss = nn.functional.nll_loss(model(x).log(), y)
    with pytest.raises(ValueError, match=r"not a log-softmax over the classes.*Fix: compute the loss as cross_entropy"):
        with cp(0, info={"loss": loss}):
            loss.backward()
    cp = Cockpit(model, [TICDiag()], diagnose=False)
    loss = nn.functional.nll_loss(model(x).log(), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    entry = cp.get_output()[0]
    assert math.isnan(entry["TICDiag"]) and "not a log-softmax" in entry["flags"][0]
    # the fix it names
    model_logits = nn.Sequential(nn.Linear(3, 4)).double()
    cp = Cockpit(model_logits, [HessTrace(curvature="diag_ggn_exact")], diagnose=False, strict=True)
    loss = nn.functional.cross_entropy(model_logits(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert math.isfinite(sum(cp.get_output()[0]["HessTrace"]))


def test_a_use_the_engine_does_not_see_takes_the_global_path_at_once():
    """A weight also read by its parent's own code (a use no rule sees): the first pass's check against
    autograd's gradient of the pseudo-loss fails, the weight takes the global path (with the engine's
    warning), and the pass runs again: the diagonal is exact at that very step, never a wrong number."""

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(3, 3)

        def forward(self, x):
            return self.inner(x) + x @ self.inner.weight

    torch.manual_seed(0)
    model = Parent().double()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    cp = Cockpit(model, [Diagonal(curvature="diag_ggn_exact")], diagnose=False)
    loss = nn.functional.cross_entropy(model(x), y)
    with pytest.warns(UserWarning, match="could not be formed by a layer rule"):
        with cp(0, info={"loss": loss}):
            loss.backward()
    assert cp.engine.force_global == {0} and "flags" not in cp.get_output()[0]
    expected = problems.ggn_of(copy.deepcopy(model), x, lambda f: nn.functional.cross_entropy(f, y)).diagonal()
    assert_diagonal(cp.get_output(), 0, expected, None)


def test_passes_count_rows_and_classes():
    """One exact pass per class but one (a sample's outputs: the softmax's Hessian has rank C − 1), per
    position and token but one (a sequence), per output element (MSE)."""

    class Info:
        def __init__(self, loss, batch_size):
            self.batch_size, self.step, self._loss, self._derived = batch_size, 0, loss, {}

        def require(self, key, quantity):
            return self._loss

        def derived(self, key, make):
            return make()

    logits = torch.randn(2, 3, 5, requires_grad=True)
    tokens = nn.functional.cross_entropy(logits.reshape(-1, 5), torch.zeros(6, dtype=torch.long))
    assert ggn.output_curvature(Info(tokens, 2)).passes == 12
    outputs = torch.randn(4, 2, 3, requires_grad=True)
    assert ggn.output_curvature(Info(nn.functional.mse_loss(outputs, torch.zeros(4, 2, 3)), 4)).passes == 6
    assert "takes 12 backward passes per step" in ggn.support(Info(tokens, 2), max_passes=11)
    assert ggn.support(Info(tokens, 2), max_passes=12) is None
