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


@pytest.mark.parametrize("name", ["custom", "resnet_bn_train", "gpt"])
def test_hutchinson_estimate_within_three_standard_errors(name):
    """With Hutchinson's trace (many probes) the ratio lands within 3 of its recorded standard errors."""
    problem = problems.make(name, 4, steps=1)
    cp, snapshots = problems.run(problem, [TICTrace(epsilon=EPSILON, curvature="hutchinson", probes=400)])
    entry = cp.get_output()[0]
    expected, _ = reference(problem, snapshots, 0)
    meta = entry["meta"]["TICTrace"]
    assert meta["curvature"] == "hutchinson" and meta["probes"] == 400
    assert abs(entry["TICTrace"] - float(expected)) <= 3 * meta["se"]
