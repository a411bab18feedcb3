"""MeanGSNR against a brute-force float64 reference."""

import pytest
import torch

import problems
from cockpit_lite.quantities import MeanGSNR

EPSILON = 1e-5


def gsnr(individual):
    """g_d² / (σ_d² + ε), σ_d² the population variance over samples, of [B, D]."""
    g = individual.mean(0)
    return g**2 / (individual.var(0, unbiased=False) + EPSILON)


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [gr.reshape(gr.shape[0], -1) for gr in grads]
    return gsnr(torch.cat(flat, 1)).mean(), [gsnr(f).mean() for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(MeanGSNR(epsilon=EPSILON), reference, case)
