"""``experiments.noisy_quadratic``: the model is the stated quadratic, and the tiny run tells the two runs apart."""

import json

import torch
from torch import nn

from experiments import noisy_quadratic as nq


def test_hessian_is_diag_h():
    h = [0.5, 10.0]
    assert torch.allclose(nq.check_hessian(h), torch.diag(torch.tensor(h, dtype=torch.float64)))


def test_model_loss_is_half_weighted_squared_distance():
    h, theta0 = [0.5, 10.0], [-4.0, 1.0]
    model = nq.QuadraticModel(h, theta0)
    centres = torch.randn(7, 2, generator=torch.Generator().manual_seed(3))
    loss = nn.MSELoss()(model(torch.ones(7, 1)), model.targets(centres))
    per_sample = 0.5 * (torch.tensor(h) * (torch.tensor(theta0) - centres) ** 2).sum(1)
    assert torch.allclose(loss, per_sample.mean())
    assert [p for p in model.parameters() if p.requires_grad] == [model.theta]


def test_tiny_run(tmp_path):
    summary = nq.main(["--tiny", "--out", str(tmp_path)])
    assert (tmp_path / "noisy_quadratic.png").stat().st_size > 10_000
    data = json.loads((tmp_path / "noisy_quadratic.json").read_text())
    assert {"config", "runs", "conclusion", "hessian_check"} <= set(data)
    large, small = data["runs"]["large"], data["runs"]["small"]
    for run in (large, small):
        assert {"theta", "minibatch_loss", "full_loss", "alpha", "update_size", "distance", "median_alpha"} <= set(run)
        assert len(run["theta"]) == data["config"]["steps"] + 1
    assert large["median_alpha"] > 0.5  # jumps across the valley
    assert small["median_alpha"] < 0  # stops short
    assert large["mean_update_size"] > 10 * small["mean_update_size"]
    assert summary["config"]["decay"]["r"] <= 1
