"""``experiments.independence_probe``: its summary keeps the largest healthy departure per tolerance,
and its cost runs."""

from experiments import independence_probe


def test_the_summary_keeps_the_largest_independent_departure_and_the_mixed_tests():
    records = [["a", 1e-9, 1e-6, False], ["b", 3e-8, 1e-6, False], ["c", 0.4, 1e-6, True],
               ["d", 2e-5, 1e-3, False]]
    healthy, mixed = independence_probe.summarize(records)
    assert healthy == {1e-6: (2, 3e-8, "b"), 1e-3: (1, 2e-5, "d")} and mixed == ["c"]


def test_the_cost_is_a_positive_ratio():
    assert independence_probe.cost("lstm", 0) > 0
