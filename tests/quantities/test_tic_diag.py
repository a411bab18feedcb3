"""TICDiag against brute-force individual gradients and Hessian diagonal."""

import pytest
import torch

import problems
from cockpit_lite.quantities import TICDiag

EPSILON = 1e-7


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    second_moment = torch.cat([(g.reshape(g.shape[0], -1) ** 2).mean(0) for g in grads])
    diagonal = problems.hessian(problem, snapshots[step]).diagonal()
    parts = [(second_moment[b] / (diagonal[b] + EPSILON)).sum() for b in problems.layer_blocks(problem)]
    return sum(parts), parts


@pytest.mark.parametrize("case", problems.CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(TICDiag(epsilon=EPSILON), reference, case)


def test_hutchinson_estimate_within_three_standard_errors():
    """A model whose Hessian diagonal stays away from zero: the ratio of estimates is close (3 SE)."""
    problem = problems.make("mse", 5, steps=1)
    cp, snapshots = problems.run(problem, [TICDiag(epsilon=EPSILON, curvature="hutchinson", probes=2000)])
    entry = cp.get_output()[0]
    expected, _ = reference(problem, snapshots, 0)
    assert abs(entry["TICDiag"] - float(expected)) <= 3 * entry["meta"]["TICDiag"]["se"]
