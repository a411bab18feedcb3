"""MeanGSNR against a brute-force float64 reference."""

import functools

import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import MeanGSNR

DEFAULT_EPSILON = 1e-5
"""Cockpit's ε, the documented default."""


def gsnr(individual, epsilon):
    """g_d² / (σ_d² + ε), σ_d² the population variance over samples, of [B, D]."""
    g = individual.mean(0)
    return g**2 / (individual.var(0, unbiased=False) + epsilon)


def reference(problem, snapshots, step, epsilon=DEFAULT_EPSILON):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [gr.reshape(gr.shape[0], -1) for gr in grads]
    return gsnr(torch.cat(flat, 1), epsilon).mean(), [gsnr(f, epsilon).mean() for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(MeanGSNR(epsilon=1e-3), functools.partial(reference, epsilon=1e-3), case)


@pytest.mark.parametrize("case", [("mlp", 5, "mean"), ("cnn", 2, "sum"), ("mse", 5, "mean")], ids=problems.case_id)
def test_default_epsilon_is_1e_5(case):
    """A default-constructed MeanGSNR against the brute force with ε = 1e-5."""
    problems.check(MeanGSNR(), reference, case)


def test_schedule_and_verbose_are_passed_on(capsys):
    """track_schedule and verbose reach the base class: values (and a printed line) at steps 0 and 2 only."""
    quantity = MeanGSNR(track_schedule=schedules.linear(2), verbose=True, epsilon=1e-3)
    problems.check(quantity, functools.partial(reference, epsilon=1e-3), ("mlp", 5, "mean"), steps=4, schedule_steps=[0, 2])
    printed = [line for line in capsys.readouterr().out.splitlines() if "MeanGSNR" in line]
    assert len(printed) == 2 and "step 0]" in printed[0] and "step 2]" in printed[1]


def test_quiet_by_default(capsys):
    problems.check(MeanGSNR(), reference, ("mlp", 2, "mean"), steps=1)
    assert "MeanGSNR" not in capsys.readouterr().out
