"""``experiments.independence_probe``: the departure it records is the row statistic ``_mixes`` decides
on (hand-made products), its summary keeps the largest healthy departure per tolerance, and its cost runs."""

import math

import torch

from experiments import independence_probe


def test_departure_is_the_largest_row_s_relative_difference():
    g = torch.Generator().manual_seed(0)
    weights = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64)
    ones = torch.randn(3, 4, generator=g, dtype=torch.float64)
    weighted = weights[:, None] * ones
    assert independence_probe.departure(ones, weighted, weights) == 0.0
    weighted[1] += 1e-3 * ones[1]  # row 1 off by 1e-3 of its own (weight-1) size
    assert math.isclose(independence_probe.departure(ones, weighted, weights), 1e-3, rel_tol=1e-9)
    assert independence_probe.departure(torch.ones(2, 4), torch.ones(2, 4), weights) is None


def test_the_summary_keeps_the_largest_independent_departure_and_the_mixed_tests():
    records = [["a", 1e-9, 1e-6, False], ["b", 3e-8, 1e-6, False], ["c", 0.4, 1e-6, True],
               ["d", 2e-5, 1e-3, False], ["e", None, 1e-3, False]]
    healthy, mixed = independence_probe.summarize(records)
    assert healthy == {1e-6: (2, 3e-8, "b"), 1e-3: (1, 2e-5, "d")} and mixed == ["c"]


def test_the_cost_is_a_positive_ratio():
    assert independence_probe.cost("lstm", 0) > 0
