"""``python -m experiments.hess_max_ev_starts``: HessMaxEV's misses by its number of start vectors."""

import pytest
import torch
from torch import nn

from experiments import hess_max_ev_starts as starts


@pytest.mark.parametrize("problem", ["cnn", "mlp"])
def test_the_reference_is_the_top_eigenvalue_of_the_autograd_hessian(problem):
    make, shape = starts.PROBLEMS[problem]
    torch.manual_seed(0)
    model = make().double()
    x = torch.randn(8, *shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.arange(8) % 4
    names, params = zip(*model.named_parameters())
    sizes = [p.numel() for p in params]

    def loss_of(flat):
        tensors = {n: v.reshape(p.shape) for n, v, p in zip(names, flat.split(sizes), params)}
        return nn.functional.cross_entropy(torch.func.functional_call(model, tensors, (x,)), y)

    flat = torch.cat([p.detach().reshape(-1) for p in params])
    exact = float(torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss_of, flat)).max())
    assert starts.exact_max(model, x, y) == pytest.approx(exact, rel=1e-10)


def test_both_solvers_follow_one_trajectory_and_the_table_prints(capsys):
    values, exact = starts.run("cnn", 0, 3)
    assert len(exact) == 3 and exact[0] != exact[2]  # (trained)
    for block in (1, 2):
        for (value, products), reference in zip(values[block], exact):
            assert value == pytest.approx(reference, rel=2e-3) and products >= 1
    starts.main(["--seeds", "1", "--steps", "2", "--problems", "cnn"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["problem", "block"] and [line.split()[:2] for line in lines[2:]] == [
        ["cnn", "1"], ["cnn", "2"]]
