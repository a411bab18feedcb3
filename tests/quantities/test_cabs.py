"""CABS against a brute-force float64 reference."""

import pytest
import torch

import problems
from cockpit_lite.quantities import CABS

LR = 0.1


def cabs(individual, loss):
    """η Σ_d Σ_n (g_{n,d} − g_d)² / (B L) of [B, D]."""
    b = individual.shape[0]
    return LR * ((individual - individual.mean(0)) ** 2).sum() / (b * loss)


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    loss = problems.loss(problem, snapshots[step])
    flat = [g.reshape(g.shape[0], -1) for g in grads]
    return cabs(torch.cat(flat, 1), loss), [cabs(f, loss) for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(CABS(), reference, case, lr=LR)
