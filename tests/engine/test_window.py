"""Gradient accumulation: every quantity describes the effective batch the optimizer steps with.

The training loop accumulates M micro-batches per optimizer step, each backpropagating
``loss_fn(model(x_m), y_m) / M`` inside ``cp(step)`` (the same step), on a
``Cockpit(accumulate=True)``. The brute force is that of the union: one forward pass
per micro-batch (as the loop does; BatchNorm normalises each micro-batch by its own
statistics), each sample's term ``c_n`` of the loss the optimizer minimises,
``L = Σ_m L_m``, and ``g̃_n = B ∇c_n`` with ``B = Σ_m B_m`` by a loop of
``torch.autograd.grad``; the quantities' own brute-force references
(``tests/quantities``) are evaluated on it.
"""

import copy
import math

import pytest
import torch
from torch import nn

import models
import problems
from cockpit_lite import Cockpit
from cockpit_lite.quantities import (
    CABS, Alpha, EarlyStopping, GradNorm, GradVariance, InnerTest, Loss, MeanGSNR, NormTest, OrthoTest,
)
from quantities import (
    test_alpha, test_cabs, test_early_stopping, test_grad_norm, test_grad_variance, test_inner_test, test_loss,
    test_mean_gsnr, test_norm_test, test_ortho_test,
)

QUANTITIES = {  # quantity -> (reference, per-layer values as well)
    GradNorm: (test_grad_norm.reference, False),
    NormTest: (test_norm_test.reference, True),
    InnerTest: (test_inner_test.reference, True),
    OrthoTest: (test_ortho_test.reference, True),
    GradVariance: (test_grad_variance.reference, False),
    MeanGSNR: (test_mean_gsnr.reference, True),
    EarlyStopping: (test_early_stopping.reference, True),
    CABS: (test_cabs.reference, True),
    Loss: (test_loss.reference, False),
}


class Accumulated:
    """A problem whose every batch is ``len(sizes)`` micro-batches, each loss divided by their number."""

    def __init__(self, problem, sizes, divide=True):
        self._problem, self.sizes = problem, sizes
        self.divisor = len(sizes) if divide else 1

    def __getattr__(self, name):
        return getattr(self._problem, name)

    def micro_batches(self, x, y):
        starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        return [(x[s:s + b], y[s:s + b]) for s, b in zip(starts, self.sizes)]

    def contributions(self, model, x, y):
        """``c_n`` of ``L = Σ_m L_m / M``, one forward pass per micro-batch."""
        return torch.cat([self._problem.contributions(model, xm, ym) for xm, ym in self.micro_batches(x, y)]) / self.divisor

    def loss_of(self, model, x, y, reduction=None):
        return sum(self._problem.loss_of(model, xm, ym, reduction) for xm, ym in self.micro_batches(x, y)) / self.divisor


def train(problem, quantities, steps, optimizer=None, validation=False, **cockpit_kwargs):
    """The accumulating loop; returns ``(record, snapshots)`` (a snapshot's batch is the union).

    ``validation``: a forward pass with gradients on, of another batch size, before every micro-batch's.
    """
    params = list(problem.model.parameters())
    opt = optimizer(params) if optimizer else torch.optim.SGD(params, lr=0.1)
    cp = Cockpit(problem.model, quantities=quantities, **{"strict": True, "diagnose": False, "accumulate": True,
                                                           **cockpit_kwargs})
    snapshots = {}
    for step, (x, y) in enumerate(problem.batches[:steps]):
        snapshots[step] = problems.Snapshot(
            [p.detach().clone() for p in params], x, y, copy.deepcopy(problem.model.state_dict()), torch.get_rng_state()
        )
        opt.zero_grad()
        for xm, ym in problem.micro_batches(x, y):
            if validation:
                problem.model(torch.cat([x, x[:1]]))
            loss = problem.lossfunc(problem.model(xm), ym) / problem.divisor
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
        opt.step()
    cp.close()
    return cp.get_output(), snapshots


CASES = [
    (name, sizes, reduction)
    for name in ("mlp", "cnn", "resnet_bn_train", "transformer_dropout", "gpt", "lstm")
    for sizes in ((3, 3), (2, 4))
    for reduction in ("mean", "sum")
]


@pytest.mark.parametrize("case", CASES, ids=problems.case_id)
def test_every_quantity_describes_the_union_of_the_micro_batches(case):
    name, sizes, reduction = case
    problem = Accumulated(problems.make(name, sum(sizes), reduction, steps=4), list(sizes))
    record, snapshots = train(problem, [q() for q in QUANTITIES] + [Alpha()], steps=4)
    for step in range(3):
        entry = record[step]
        assert entry["batch"] == {"size": sum(sizes), "accumulated": False, "passes": len(sizes)}
        for quantity, (reference, layers) in QUANTITIES.items():
            expected = reference(problem, snapshots, step)
            what = f"{quantity.__name__}, {case}, step {step}"
            if layers:
                expected, per_layer = expected
                problems.assert_close(entry["layers"][quantity.__name__], per_layer, rtol=1e-6, what=what + " layers")
            problems.assert_close(entry[quantity.__name__], expected, rtol=1e-6, what=what)
        problems.assert_close(entry["Alpha"], test_alpha.reference(problem, snapshots, step), rtol=1e-6, what=f"Alpha, {case}")


def test_several_optimizers_complete_the_step_when_the_first_of_them_steps():
    """``info["optimizer"] = [muon, adamw]``: the step is complete before the first of them steps (their
    joint step pre-hook), and α reads the update once both have stepped."""
    problem = Accumulated(problems.make("mlp", 6, "mean", steps=3), [3, 3])
    record, snapshots = train(problem, [NormTest(), Alpha()], steps=3, optimizer=test_alpha.muon_and_adamw)
    for step in range(2):
        assert record[step]["batch"] == {"size": 6, "accumulated": False, "passes": 2}
        problems.assert_close(record[step]["NormTest"], test_norm_test.reference(problem, snapshots, step)[0],
                              rtol=1e-6, what="NormTest")
        problems.assert_close(record[step]["Alpha"], test_alpha.reference(problem, snapshots, step), rtol=1e-6,
                              what="Alpha")


def test_a_loop_that_does_not_divide_the_loss_is_described_as_the_optimizer_sees_it():
    """Summed micro-batch losses (no ``/ M``): ``L = Σ_m L_m``, M times the union's mean."""
    problem = Accumulated(problems.make("mlp", 6, "mean", steps=2), [3, 3], divide=False)
    record, snapshots = train(problem, [NormTest(), GradNorm(), Loss()], steps=2)
    for quantity in (NormTest, GradNorm, Loss):
        reference, layers = QUANTITIES[quantity]
        expected = reference(problem, snapshots, 1)
        problems.assert_close(record[1][quantity.__name__], expected[0] if layers else expected, what=quantity.__name__)


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_a_validation_forward_pass_between_micro_batches_is_not_part_of_the_step(name):
    problem = Accumulated(problems.make(name, 6, "mean", steps=3), [3, 3])
    record, snapshots = train(problem, [NormTest(), GradVariance()], steps=3, validation=True)
    for step in range(3):
        expected, _ = test_norm_test.reference(problem, snapshots, step)
        problems.assert_close(record[step]["NormTest"], expected, what=f"NormTest {name}")
        problems.assert_close(record[step]["GradVariance"], test_grad_variance.reference(problem, snapshots, step),
                              what=f"GradVariance {name}")


def test_one_micro_batch_per_step_gives_the_values_without_accumulation():
    """``accumulate=True`` on a loop of one backward pass per step: the same numbers."""
    quantities = lambda: [NormTest(), GradVariance(), MeanGSNR(), Alpha(), Loss()]  # noqa: E731
    accumulated, _ = train(Accumulated(problems.make("transformer", 4, "mean", steps=3), [4]), quantities(), steps=3)
    plain, _ = problems.run(problems.make("transformer", 4, "mean", steps=3), quantities())
    for step in range(2):
        for name in ("NormTest", "GradVariance", "MeanGSNR", "Alpha", "Loss"):
            problems.assert_close(accumulated[step][name], plain.get_output()[step][name], rtol=1e-10, what=name)


def test_adam_with_clipping_between_the_last_backward_and_the_step():
    """α under AdamW with ``clip_grad_norm_`` of the accumulated gradient, and GradNorm of the unclipped one."""
    problem = Accumulated(problems.make("mlp", 6, "mean", steps=4), [2, 4])
    params = list(problem.model.parameters())
    opt = torch.optim.AdamW(params, lr=0.01)
    cp = Cockpit(problem.model, quantities=[Alpha(), GradNorm()], strict=True, diagnose=False, accumulate=True)
    snapshots = {}
    for step, (x, y) in enumerate(problem.batches):
        snapshots[step] = problems.Snapshot([p.detach().clone() for p in params], x, y)
        opt.zero_grad()
        for xm, ym in problem.micro_batches(x, y):
            loss = problem.lossfunc(problem.model(xm), ym) / 2
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.05)
        opt.step()
    cp.close()
    record = cp.get_output()
    for step in range(3):
        problems.assert_close(record[step]["GradNorm"], test_grad_norm.reference(problem, snapshots, step), what="GradNorm")
    # the first start steps keep the individual gradients and see that clipping turned Adam's step: exact
    for step in (0, 1, 2):
        problems.assert_close(record[step]["Alpha"], test_alpha.reference(problem, snapshots, step), rtol=1e-6, what="Alpha")


def test_a_use_the_engine_did_not_see_is_nan_in_an_accumulated_step_not_a_partial_sum():
    """A weight read by its layer and again by the model's own code fails the per-pass check
    against autograd in every micro-batch: its values are NaN with the flag (then the exact
    global path serves it, and the next step matches the brute force)."""
    from test_engine import TiedFunctionally

    torch.manual_seed(0)
    model = TiedFunctionally().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [GradVariance()], diagnose=False, accumulate=True)
    g = torch.Generator().manual_seed(0)
    batches = [[(torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (3,), generator=g))
                for _ in range(2)] for _ in range(2)]
    params = list(model.parameters())
    snapshots = []
    with pytest.warns(UserWarning, match="lin.weight"):
        for step, micro in enumerate(batches):
            snapshots.append([p.detach().clone() for p in params])
            opt.zero_grad()
            for x, y in micro:
                loss = torch.nn.functional.cross_entropy(model(x), y) / 2
                with cp(step, info={"loss": loss, "optimizer": opt}):
                    loss.backward()
            opt.step()
    record = cp.get_output()
    assert math.isnan(record[0]["GradVariance"][0]) and math.isfinite(record[0]["GradVariance"][2])
    assert any("lin.weight unavailable" in f for f in record[0]["flags"])
    # step 1, by the global path: the unbiased variance of g̃_n = B ∇c_n over the union, c_n = ce_n / (3 · 2)
    reference = TiedFunctionally().double()
    with torch.no_grad():
        for p, value in zip(reference.parameters(), snapshots[1]):
            p.copy_(value)
    rows = []
    for x, y in batches[1]:
        losses = torch.nn.functional.cross_entropy(reference(x), y, reduction="none") / (3 * 2)
        rows += [torch.autograd.grad(c, reference.lin.weight, retain_graph=True)[0].reshape(-1) * 6 for c in losses]
    expected = torch.stack(rows).var(0).sum()
    problems.assert_close(record[1]["GradVariance"][0], expected, what="GradVariance lin.weight, global path")


def test_a_transform_that_fails_when_the_accumulated_step_completes_is_nan_with_a_flag(monkeypatch):
    """The transforms of an accumulated step run in the optimizer's step pre-hook: one that raises
    there makes its parameter NaN with a flag (never a crash of ``opt.step()``), the others keep
    the union's values, and the global path serves it exactly from the next step on."""
    from cockpit_lite.engine.transforms import SumGradSquared
    from test_engine import plant_failure_once

    problem = Accumulated(problems.make("mlp", 6, "mean", steps=3), [3, 3])
    failing = list(problem.model.parameters())[2]
    plant_failure_once(monkeypatch, SumGradSquared, "__call__", failing)
    with pytest.warns(UserWarning, match="planted failure"):
        record, snapshots = train(problem, [GradVariance()], steps=2, strict=False)
    assert any("unavailable at this step: RuntimeError: planted failure" in f for f in record[0]["flags"])
    for step in range(2):
        expected = test_grad_variance.reference(problem, snapshots, step)
        for index, value in enumerate(record[step]["GradVariance"]):
            if step == 0 and index == 2:
                assert math.isnan(value)
            else:
                problems.assert_close(value, expected[index], rtol=1e-6, what=f"GradVariance, failed transform, step {step}")
    assert "flags" not in record[1]


class _BranchForPairs(torch.nn.Module):
    """An MLP whose extra layer joins in only for batches of 2 samples (a data-dependent branch, as a mixture of
    experts routes some batches away from an expert): in micro-batches of 2 and 4 only the first reaches it."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        self.extra = torch.nn.Linear(6, 3)

    def forward(self, x):
        out = self.body(x)
        return out + self.extra(x) if len(x) == 2 else out


SKIPPING = {  # name -> (problem's builders, micro-batch sizes, parameters on the global path at each step)
    "branch_for_pairs": ((_BranchForPairs, *problems.BUILDERS["mlp"][1:]), [2, 4], None),
    "sparse_expert": ((models.SparseExpert, nn.CrossEntropyLoss, models.routed_to_expert, models._classes), [4, 4],
                      [4, 5]),
}
"""``sparse_expert``: the second micro-batch routes two of its samples to the expert (its layers on a subset of
the samples, each row its sample's), the first none. The expert's first layer takes the global path in the
second (its rows reach the batch through the second layer, a path the engine does not follow), and
neither in the first."""


@pytest.mark.parametrize("name", SKIPPING)
def test_a_layer_one_micro_batch_skips_has_zero_rows_there(name, monkeypatch):
    """Its zeros in the micro-batch that skips it (no global path) join its rows of the other one: every
    quantity is the brute force's of the union."""
    from engine.test_rules import _global_path_uses

    builders, sizes, global_path = SKIPPING[name]
    monkeypatch.setitem(problems.BUILDERS, name, builders)
    used = _global_path_uses(monkeypatch)
    problem = Accumulated(problems.make(name, sum(sizes), steps=4), sizes)
    record, snapshots = train(problem, [q() for q in QUANTITIES], steps=4)
    for step in range(3):
        for quantity, (reference, layers) in QUANTITIES.items():
            expected = reference(problem, snapshots, step)
            what = f"{quantity.__name__}, {name}, step {step}"
            if layers:
                expected, per_layer = expected
                problems.assert_close(record[step]["layers"][quantity.__name__], per_layer, rtol=1e-6, what=what)
            problems.assert_close(record[step][quantity.__name__], expected, rtol=1e-6, what=what)
    assert used == ([] if global_path is None else [global_path] * 4)  # (4 steps, one micro-batch each)
