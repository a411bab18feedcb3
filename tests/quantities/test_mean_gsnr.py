"""MeanGSNR against a brute-force float64 reference."""

import functools

import numpy as np

import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import MeanGSNR

DEFAULT_EPSILON = 1e-5
"""Cockpit's ε, the documented default."""


def gsnr(individual, epsilon):
    """g_d² / (σ_d² + ε), σ_d² the population variance over samples, of [B, D]."""
    g = individual.mean(0)
    return g**2 / (individual.var(0, unbiased=False) + epsilon)


def reference(problem, snapshots, step, epsilon=DEFAULT_EPSILON):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [gr.reshape(gr.shape[0], -1) for gr in grads]
    return gsnr(torch.cat(flat, 1), epsilon).mean(), [gsnr(f, epsilon).mean() for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(MeanGSNR(epsilon=1e-3), functools.partial(reference, epsilon=1e-3), case)


@pytest.mark.parametrize("case", [("mlp", 5, "mean"), ("cnn", 2, "sum"), ("mse", 5, "mean")], ids=problems.case_id)
def test_default_epsilon_is_1e_5(case):
    """A default-constructed MeanGSNR against the brute force with ε = 1e-5."""
    problems.check(MeanGSNR(), reference, case)


def test_schedule_and_verbose_are_passed_on(capsys):
    """track_schedule and verbose reach the base class: values (and a printed line) at steps 0 and 2 only."""
    quantity = MeanGSNR(track_schedule=schedules.linear(2), verbose=True, epsilon=1e-3)
    problems.check(quantity, functools.partial(reference, epsilon=1e-3), ("mlp", 5, "mean"), steps=4, schedule_steps=[0, 2])
    printed = [line for line in capsys.readouterr().out.splitlines() if "MeanGSNR" in line]
    assert len(printed) == 2 and "step 0]" in printed[0] and "step 2]" in printed[1]


def test_quiet_by_default(capsys):
    problems.check(MeanGSNR(), reference, ("mlp", 2, "mean"), steps=1)
    assert "MeanGSNR" not in capsys.readouterr().out


def test_bf16_autocast_matches_brute_force_of_the_same_forward():
    """Autograd's gradient under autocast is rounded to bf16 (2⁻⁸ relative), more than the variance of
    a high-SNR element: σ² = Σ g̃²/B − g² with that gradient went negative (MeanGSNR −0.59 against
    478). With g summed from the same individual gradients it matches the brute force; 2e-2 allows for
    the engine reading the first layer's input in float32 where autograd uses its bf16 cast."""
    record, individual = problems.run_autocast(MeanGSNR())
    for step, flat in enumerate(individual):
        expected_total = gsnr(torch.cat(flat, 1), DEFAULT_EPSILON).mean()
        expected_layers = [gsnr(f, DEFAULT_EPSILON).mean() for f in flat]
        assert expected_total > 100  # the regime where the rounding of g mattered
        problems.assert_close(record[step]["MeanGSNR"], expected_total, rtol=2e-2, what="MeanGSNR bf16")
        problems.assert_close(record[step]["layers"]["MeanGSNR"], expected_layers, rtol=2e-2, what="MeanGSNR bf16 layers")


def test_a_variance_lost_in_rounding_is_nan_and_flagged():
    """float32 individual gradients of the last bias equal to 6 significant digits (targets 10⁵ away):
    Σ g̃² − B g² cannot resolve their variance in float32; the last bias (and with it the total) is NaN
    with a flag, the weights keep their values."""
    record, individual = problems.run_autocast(MeanGSNR(), steps=1, offset=1e5, autocast=False)
    entry = record[0]
    layers = entry["layers"]["MeanGSNR"]
    assert np.isnan(entry["MeanGSNR"]) and np.isnan(layers[3])
    assert any("2.bias" in flag and "lost in the rounding" in flag for flag in entry["flags"])
    problems.assert_close(layers[:3], [gsnr(f, DEFAULT_EPSILON).mean() for f in individual[0][:3]], rtol=1e-4)


def test_the_quantities_of_one_step_share_its_centred_sums(monkeypatch):
    """``GradVariance``, ``MeanGSNR``, ``CABS`` and ``EarlyStopping`` read ``Σ_n (g̃_n − g)²`` of one computation
    per step (``StepData.centred_squares``), and each flags a lost variance in its own name, its value for that
    parameter NaN."""
    from cockpit_lite.engine import transforms
    from cockpit_lite.quantities import CABS, EarlyStopping, GradVariance

    calls = []
    compute = transforms.centred_squares
    monkeypatch.setattr(transforms, "centred_squares", lambda data: calls.append(data.step) or compute(data))
    record, _ = problems.run_autocast([GradVariance(), MeanGSNR(), CABS(), EarlyStopping()], steps=2, offset=1e5,
                                      autocast=False)
    assert calls == [0, 1]
    flags = record[0]["flags"]
    for name in ("GradVariance", "MeanGSNR", "CABS", "EarlyStopping"):
        assert any(flag.startswith(f"{name}: ") and "2.bias" in flag and "lost in the rounding" in flag for flag in flags)
    for name in ("MeanGSNR", "CABS", "EarlyStopping"):
        assert np.isnan(record[0]["layers"][name][3]) and not np.isnan(record[0]["layers"][name][:3]).any(), name
