"""``InputStats`` against numpy on the first ``SUB_BATCH`` samples, with and without non-finite entries."""

import numpy as np
import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import InputStats
from cockpit_lite.quantities.input_stats import SUB_BATCH


def run(x):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2))
    cp = Cockpit(model, [InputStats()], diagnose=False)
    loss = torch.nan_to_num(model(x)).square().mean()  # the model sees x; the loss stays finite
    with cp(0, info={"loss": loss}):
        loss.backward()
    return cp.output[0]["InputStats"]


@pytest.mark.parametrize("nan", [False, True])
def test_against_numpy(nan):
    torch.manual_seed(0)
    x = 50 + 20 * torch.randn(40, 3, 4)
    if nan:
        x[1, 0, 0], x[3, 2, 1], x[30, 0, 0] = float("nan"), float("inf"), float("nan")  # [30] outside the sub-batch
    stats = run(x)
    sub = x[:SUB_BATCH].double().numpy().reshape(-1)
    good = sub[np.isfinite(sub)]
    assert stats["mean"] == pytest.approx(good.mean(), rel=1e-5)
    assert stats["std"] == pytest.approx(good.std(ddof=1), rel=1e-4)
    assert stats["min"] == pytest.approx(good.min()) and stats["max"] == pytest.approx(good.max())
    assert stats["nonfinite"] == pytest.approx(np.mean(~np.isfinite(sub)), rel=1e-5)


def test_integer_inputs_are_not_recorded():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 1))
    cp = Cockpit(model, [InputStats()], diagnose=False)
    loss = model(torch.randint(0, 10, (5, 3))).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert "InputStats" not in cp.output.get(0, {})
