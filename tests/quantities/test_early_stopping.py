"""EarlyStopping against a brute-force float64 reference."""

import functools
import math

import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import EarlyStopping

DEFAULT_EPSILON = 1e-5
"""Cockpit's ε, the documented default."""


def snr_criterion(individual, epsilon):
    """1 − B mean_d g_d² / (σ̂_d² + ε), σ̂² the unbiased variance, of [B, D]."""
    b = individual.shape[0]
    g = individual.mean(0)
    return 1 - b * (g**2 / (individual.var(0, unbiased=True) + epsilon)).mean()


def reference(problem, snapshots, step, epsilon=DEFAULT_EPSILON):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [g.reshape(g.shape[0], -1) for g in grads]
    return snr_criterion(torch.cat(flat, 1), epsilon), [snr_criterion(f, epsilon) for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(EarlyStopping(epsilon=1e-3), functools.partial(reference, epsilon=1e-3), case)


@pytest.mark.parametrize("case", [("mlp", 5, "mean"), ("cnn", 2, "sum"), ("mse", 5, "mean")], ids=problems.case_id)
def test_default_epsilon_is_1e_5(case):
    """A default-constructed EarlyStopping against the brute force with ε = 1e-5."""
    problems.check(EarlyStopping(), reference, case)


def test_refuses_momentum_before_backward():
    problem = problems.make("mlp", 3)
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.1, momentum=0.9)
    cp = problems.Cockpit(problem.model, [EarlyStopping()])
    x, y = problem.batches[0]
    with pytest.raises(ValueError, match="plain SGD"):
        cp(0, info={"optimizer": opt})


def test_refusals_name_the_quantity():
    problem = problems.make("mlp", 3)
    cp = problems.Cockpit(problem.model, [EarlyStopping()])
    with pytest.raises(ValueError, match="EarlyStopping is defined for plain SGD"):
        cp(0, info={"optimizer": torch.optim.Adam(problem.model.parameters())})
    with pytest.raises(ValueError, match=r"EarlyStopping needs info\['optimizer'\]"):
        cp(1, info={})


def test_schedule_and_verbose_are_passed_on(capsys):
    """track_schedule and verbose reach the base class: values (and a printed line) at steps 0 and 2 only."""
    quantity = EarlyStopping(track_schedule=schedules.linear(2), verbose=True, epsilon=1e-3)
    problems.check(quantity, functools.partial(reference, epsilon=1e-3), ("mlp", 5, "mean"), steps=4, schedule_steps=[0, 2])
    printed = [line for line in capsys.readouterr().out.splitlines() if "EarlyStopping" in line]
    assert len(printed) == 2 and "step 0]" in printed[0] and "step 2]" in printed[1]
    problems.check(EarlyStopping(), reference, ("mlp", 2, "mean"), steps=1)
    assert "EarlyStopping" not in capsys.readouterr().out


def test_bf16_autocast_matches_brute_force_of_the_same_forward():
    """g and σ̂² from the same individual gradients: with autograd's bf16-rounded g, g² and
    Σ g̃² − B g² disagreed by more than the high-SNR bias's variance (see tests/quantities/test_mean_gsnr.py)."""

    record, individual = problems.run_autocast(EarlyStopping())
    for step, flat in enumerate(individual):
        b = flat[0].shape[0]
        snr = [f.mean(0) ** 2 / (f.var(0, unbiased=True) + 1e-5) for f in flat]
        expected = [1 - b * s.mean() for s in snr]
        problems.assert_close(record[step]["layers"]["EarlyStopping"], expected, rtol=2e-2, what="EarlyStopping bf16")


def test_a_variance_lost_in_rounding_is_nan_and_flagged():
    """float32 individual gradients of the last bias equal to 6 significant digits (targets 10⁵ away, as in
    tests/quantities/test_mean_gsnr.py): Σ g̃² − B g² cannot resolve their variance; that bias (and with it the
    total) is NaN with a flag in EarlyStopping's name, the weights keep their brute-force values."""
    record, individual = problems.run_autocast(EarlyStopping(), steps=1, offset=1e5, autocast=False)
    entry = record[0]
    layers = entry["layers"]["EarlyStopping"]
    assert math.isnan(entry["EarlyStopping"]) and math.isnan(layers[3])
    assert len(entry["flags"]) == 1
    assert entry["flags"][0].startswith("EarlyStopping: ") and "of 2.bias is lost in the rounding" in entry["flags"][0]
    problems.assert_close(layers[:3], [snr_criterion(f, DEFAULT_EPSILON) for f in individual[0][:3]], rtol=1e-4)
