"""NormTest against a brute-force float64 reference."""

import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import NormTest


def norm_test(individual):
    """sqrt(Σ_n ‖g_n − g‖² / ((B−1) B ‖g‖²)) of flattened individual gradients [B, D]."""
    b = individual.shape[0]
    g = individual.mean(0)
    return torch.sqrt(((individual - g) ** 2).sum() / ((b - 1) * b * (g**2).sum()))


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [gr.reshape(gr.shape[0], -1) for gr in grads]
    return norm_test(torch.cat(flat, 1)), [norm_test(f) for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(NormTest(), reference, case)


def test_logarithmic_schedule():
    quantity = NormTest(track_schedule=schedules.logarithmic(0, 0.7, steps=3))
    problems.check(quantity, reference, ("cnn", 5, "sum"), steps=7, schedule_steps=[0, 1, 2, 5])
