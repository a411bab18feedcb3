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


@pytest.mark.parametrize("make", [lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9), lambda p: torch.optim.Adam(p)])
def test_other_optimizers_are_refused_naming_cabs(make):
    from torch import nn

    from cockpit_lite import Cockpit

    model = nn.Linear(3, 2)
    cp = Cockpit(model, [CABS()], diagnose=False)
    loss = model(torch.randn(4, 3)).square().mean()
    with pytest.raises(ValueError, match="^CABS is defined for plain SGD"):
        with cp(0, info={"loss": loss, "optimizer": make(model.parameters())}):
            loss.backward()


def test_bf16_autocast_matches_brute_force_of_the_same_forward():
    """Σ_n (g̃_n − g)² from sums of the same individual gradients: with autograd's bf16-rounded g it
    lost the high-SNR bias's variance (see tests/quantities/test_mean_gsnr.py)."""

    from cockpit_lite.quantities import Loss

    record, individual = problems.run_autocast([CABS(), Loss()])
    for step, flat in enumerate(individual):
        b = flat[0].shape[0]
        parts = [1e-3 * ((f - f.mean(0)) ** 2).sum() / (b * record[step]["Loss"]) for f in flat]
        problems.assert_close(record[step]["layers"]["CABS"], parts, rtol=2e-2, what="CABS bf16 layers")
