"""HessMaxEV against torch.linalg.eigvalsh of the brute-force Hessian."""

import pytest
import torch

import problems
from cockpit_lite.quantities import HessMaxEV


def reference(problem, snapshots, step):
    return torch.linalg.eigvalsh(problems.hessian(problem, snapshots[step])).max()


@pytest.mark.parametrize("case", problems.CASES, ids=problems.case_id)
def test_matches_eigvalsh(case):
    problems.check(HessMaxEV(), reference, case, rtol=1e-3, layers=False)


def test_needs_the_graph():
    problem = problems.make("mlp", 3)
    cp = problems.Cockpit(problem.model, [HessMaxEV()])
    x, y = problem.batches[0]
    assert cp.create_graph(0)
    loss = problem.lossfunc(problem.model(x), y)
    with pytest.raises(ValueError, match="create_graph=cp.create_graph"):
        with cp(0, info={"loss": loss}):
            loss.backward()
