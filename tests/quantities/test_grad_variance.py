"""GradVariance against a brute-force float64 reference."""

import math

import pytest

import problems
from cockpit_lite.quantities import GradVariance


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    return [gr.reshape(gr.shape[0], -1).var(0, unbiased=True).sum() for gr in grads]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(GradVariance(), reference, case, layers=False)


def test_bf16_autocast_matches_brute_force_of_the_same_forward():
    """Under bf16 autocast, Σ g̃² − B g² with autograd's (bf16-rounded) gradient lost the variance of the
    high-SNR last bias (0.0 or negative); g summed from the individual gradients matches the brute force
    of the same autocast forward (2e-2: see tests/quantities/test_mean_gsnr.py)."""

    record, individual = problems.run_autocast(GradVariance())
    for step, flat in enumerate(individual):
        expected = [f.var(0, unbiased=True).sum() for f in flat]
        problems.assert_close(record[step]["GradVariance"], expected, rtol=2e-2, what="GradVariance bf16")


def test_a_variance_that_comes_out_zero_is_nan_and_flagged():
    """float32 individual gradients of the last bias the same to 7 digits (targets 10⁷ away): no element's
    Σ g̃² − B g² came out negative (the 4 elements' came out 0, unflagged, against 0.056 by the float64 brute
    force of the same float32 gradients); the bias's sum is below the rounding level of Σ_n ‖g̃_n‖²: NaN with
    one flag naming it, the weights keep their values."""
    record, individual = problems.run_autocast(GradVariance(), steps=1, offset=1e7, autocast=False)
    entry, flat = record[0], individual[0]
    assert flat[3].var(0, unbiased=True).sum() > 0
    assert math.isnan(entry["GradVariance"][3])
    assert len(entry["flags"]) == 1
    assert entry["flags"][0].startswith("GradVariance: the variance Σ_n ‖g̃_n − g‖² = Σ_n ‖g̃_n‖² − B ‖g‖²")
    assert "of 2.bias is lost in the rounding" in entry["flags"][0]
    problems.assert_close(entry["GradVariance"][:3], [f.var(0, unbiased=True).sum() for f in flat[:3]], rtol=1e-4)
