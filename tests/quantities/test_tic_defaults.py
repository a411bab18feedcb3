"""TICDiag() and TICTrace() with their defaults (ε = 1e-7, the exact Hessian diagonal) against brute force.

The other TIC tests pass ε explicitly; these construct the quantities with no argument.
A small ε shows only where the curvature is small, so the comparison is tight (rtol 1e-9;
the brute force and the quantities agree to about 1e-13).
"""

import math

import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import TICDiag, TICTrace

DEFAULT_EPSILON = 1e-7


def parts(problem, snapshot, matrix=problems.hessian):
    """The second moment ``(1/B) Σ_n g̃_n²``, the diagonal of ``matrix`` (the Hessian, or the GGN), the layers' slices."""
    grads = problems.individual_gradients(problem, snapshot)
    moment = torch.cat([(g.reshape(g.shape[0], -1) ** 2).mean(0) for g in grads])
    return moment, matrix(problem, snapshot).diagonal(), problems.layer_blocks(problem)


def tic_diag_of(matrix):
    """The brute-force TICDiag reference with the diagonal of ``matrix`` (``problems.hessian``, ``problems.ggn``)."""

    def reference(problem, snapshots, step):
        moment, diagonal, blocks = parts(problem, snapshots[step], matrix)
        layers = [(moment[b] / (diagonal[b] + DEFAULT_EPSILON)).sum() for b in blocks]
        return sum(layers), layers

    return reference


def tic_trace_of(matrix):
    """The brute-force TICTrace reference with the diagonal of ``matrix``."""

    def reference(problem, snapshots, step):
        moment, diagonal, blocks = parts(problem, snapshots[step], matrix)
        layers = [moment[b].sum() / (diagonal[b].sum() + DEFAULT_EPSILON) for b in blocks]
        return moment.sum() / (diagonal.sum() + DEFAULT_EPSILON), layers

    return reference


tic_diag, tic_trace = tic_diag_of(problems.hessian), tic_trace_of(problems.hessian)
ggn_tic_diag, ggn_tic_trace = tic_diag_of(problems.ggn), tic_trace_of(problems.ggn)


@pytest.mark.parametrize("case", [("mlp", 5, "mean"), ("cnn", 2, "sum"), ("mse", 5, "mean")], ids=problems.case_id)
@pytest.mark.parametrize("quantity,reference", [(TICDiag, tic_diag), (TICTrace, tic_trace)], ids=["diag", "trace"])
def test_defaults_match_brute_force(case, quantity, reference):
    record = problems.check(quantity(), reference, case, rtol=1e-9)
    assert all(record[s]["meta"][quantity.__name__]["curvature"] == "diag_h" for s in record)


@pytest.mark.parametrize("quantity,reference", [(TICDiag, tic_diag), (TICTrace, tic_trace)], ids=["diag", "trace"])
def test_schedule_and_verbose_are_passed_on(quantity, reference, capsys):
    """track_schedule and verbose reach the base class: values (and a printed line) at steps 0 and 2 only."""
    problems.check(quantity(track_schedule=schedules.linear(2), verbose=True), reference, ("mlp", 5, "mean"),
                   steps=4, rtol=1e-9, schedule_steps=[0, 2])
    printed = [line for line in capsys.readouterr().out.splitlines() if quantity.__name__ in line]
    assert len(printed) == 2 and "step 0]" in printed[0] and "step 2]" in printed[1]
    problems.check(quantity(), reference, ("mlp", 2, "mean"), steps=1, rtol=1e-9)
    assert quantity.__name__ not in capsys.readouterr().out


ESTIMATES = ("hutchinson", "diag_ggn_mc")


@pytest.mark.parametrize("quantity", [TICDiag, TICTrace], ids=["diag", "trace"])
@pytest.mark.parametrize("curvature", ESTIMATES)
def test_an_estimated_diagonal_gives_nan_with_the_reason_and_the_fix(quantity, curvature, monkeypatch):
    """A ratio with an estimated denominator is not an estimate of the TIC: NaN (total and
    layers) with a flag saying why and how to get the exact diagonal; no product is taken, and
    the engine does not watch the forward pass (no hook on the model after the step)."""
    problem = problems.make("mlp", 5, steps=1)
    hooks = [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in problem.model.modules()]
    tic = quantity(curvature=curvature)
    made = problems.products_made(monkeypatch)
    cp, _ = problems.run(problem, [tic])
    assert made == []
    assert [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in problem.model.modules()] == hooks
    entry = cp.get_output()[0]
    assert math.isnan(entry[quantity.__name__])
    assert all(math.isnan(v) for v in entry["layers"][quantity.__name__])
    assert entry["meta"][quantity.__name__] == {"curvature": None}
    (flag,) = entry["flags"]
    assert flag.startswith(f"{quantity.__name__}: not computed: curvature={curvature!r} is an estimate")
    assert "cockpit_lite.extend(...)" in flag and "curvature='diag_ggn_exact'" in flag


@pytest.mark.parametrize("case", [("resnet_bn_train", 3, "mean"), ("lstm", 4, "sum")], ids=problems.case_id)
@pytest.mark.parametrize("quantity,reference", [(TICDiag, ggn_tic_diag), (TICTrace, ggn_tic_trace)],
                         ids=["diag", "trace"])
def test_auto_beyond_backpack_takes_the_engines_exact_ggn_diagonal(case, quantity, reference, monkeypatch):
    """Models BackPACK cannot serve (BatchNorm in training mode, an LSTM; not extended): "auto"
    takes the engine's exact GGN diagonal (one backward pass per class but one), never an estimate (no
    Hessian-vector products), and says so in the record."""
    made = problems.products_made(monkeypatch)
    record = problems.check(quantity(), reference, case, steps=2, rtol=1e-9)
    assert made == []
    assert all(record[s]["meta"][quantity.__name__] == {"curvature": "diag_ggn_exact", "passes": 2} for s in record)


@pytest.mark.parametrize("quantity", [TICDiag, TICTrace], ids=["diag", "trace"])
def test_auto_over_max_passes_gives_nan_naming_the_passes_and_the_fix_works(quantity, monkeypatch):
    """The GPT's exact GGN diagonal takes one pass per position and token but one (5 × 10): over
    ``max_passes`` "auto" computes nothing and says why; the fix the flag names
    (curvature='diag_ggn_exact') gives the exact value."""
    problem = problems.make("gpt", 3, steps=1)
    made = problems.products_made(monkeypatch)
    cp, _ = problems.run(problem, [quantity(max_passes=49)])
    entry = cp.get_output()[0]
    assert math.isnan(entry[quantity.__name__]) and made == []
    assert entry["meta"][quantity.__name__] == {"curvature": None}
    (flag,) = entry["flags"]
    assert "not BackPACK-extended" in flag and "takes 50 backward passes per step" in flag
    assert "max_passes=49" in flag and "Fix: pass curvature='diag_ggn_exact'" in flag
    reference = ggn_tic_diag if quantity is TICDiag else ggn_tic_trace
    problems.check(quantity(curvature="diag_ggn_exact"), reference, ("gpt", 3, "mean"), steps=1, rtol=1e-9)
    problems.check(quantity(max_passes=50), reference, ("gpt", 3, "mean"), steps=1, rtol=1e-9)
