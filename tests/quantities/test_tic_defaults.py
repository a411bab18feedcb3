"""TICDiag() and TICTrace() with their defaults (ε = 1e-7, the exact Hessian diagonal) against brute force.

The other TIC tests pass ε explicitly; these construct the quantities with no argument.
A small ε shows only where the curvature is small, so the comparison is tight (rtol 1e-9;
the brute force and the quantities agree to about 1e-13).
"""

import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import TICDiag, TICTrace

DEFAULT_EPSILON = 1e-7


def parts(problem, snapshot):
    grads = problems.individual_gradients(problem, snapshot)
    moment = torch.cat([(g.reshape(g.shape[0], -1) ** 2).mean(0) for g in grads])
    return moment, problems.hessian(problem, snapshot).diagonal(), problems.layer_blocks(problem)


def tic_diag(problem, snapshots, step):
    moment, diagonal, blocks = parts(problem, snapshots[step])
    layers = [(moment[b] / (diagonal[b] + DEFAULT_EPSILON)).sum() for b in blocks]
    return sum(layers), layers


def tic_trace(problem, snapshots, step):
    moment, diagonal, blocks = parts(problem, snapshots[step])
    layers = [moment[b].sum() / (diagonal[b].sum() + DEFAULT_EPSILON) for b in blocks]
    return moment.sum() / (diagonal.sum() + DEFAULT_EPSILON), layers


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


def hutchinson_values(**kwargs):
    problem = problems.make("mlp", 5, steps=1)
    cp, _ = problems.run(problem, [TICDiag(curvature="hutchinson", **kwargs)])
    entry = cp.get_output()[0]
    return entry["TICDiag"], entry["meta"]["TICDiag"]


def test_hutchinson_defaults_are_16_probes_and_seed_0():
    value, meta = hutchinson_values()
    assert meta["probes"] == 16
    same, _ = hutchinson_values(seed=0, probes=16)
    other, _ = hutchinson_values(seed=1)
    assert value == pytest.approx(same, rel=1e-12)
    assert abs(other - value) > 1e-6 * abs(value)
