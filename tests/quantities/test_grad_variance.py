"""GradVariance against a brute-force float64 reference."""

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
