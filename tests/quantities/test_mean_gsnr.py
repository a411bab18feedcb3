"""MeanGSNR against a brute-force float64 reference."""

import functools

import pytest
import torch

import problems
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
