"""TICTrace against brute-force individual gradients and Hessian trace."""

import pytest
import torch

import problems
from cockpit_lite.quantities import TICTrace

EPSILON = 1e-7


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    second_moment = torch.cat([(g.reshape(g.shape[0], -1) ** 2).mean(0) for g in grads])
    diagonal = problems.hessian(problem, snapshots[step]).diagonal()
    layers = [second_moment[b].sum() / (diagonal[b].sum() + EPSILON) for b in problems.layer_blocks(problem)]
    return second_moment.sum() / (diagonal.sum() + EPSILON), layers


@pytest.mark.parametrize("case", problems.CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(TICTrace(epsilon=EPSILON), reference, case)


def ggn_reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    second_moment = torch.cat([(g.reshape(g.shape[0], -1) ** 2).mean(0) for g in grads])
    diagonal = problems.ggn(problem, snapshots[step]).diagonal()
    layers = [second_moment[b].sum() / (diagonal[b].sum() + EPSILON) for b in problems.layer_blocks(problem)]
    return second_moment.sum() / (diagonal.sum() + EPSILON), layers


@pytest.mark.parametrize("case", problems.CASES[1::3], ids=problems.case_id)
def test_exact_ggn_diagonal_matches_brute_force(case):
    record = problems.check(TICTrace(epsilon=EPSILON, curvature="diag_ggn_exact"), ggn_reference, case)
    assert all(entry["meta"]["TICTrace"] == {"curvature": "diag_ggn_exact"} for entry in record.values())
