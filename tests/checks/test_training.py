"""``training``: the helpers of the checks that train a copy of the model."""

from types import SimpleNamespace

import torch

from cockpit_lite.checks.training import looks_like_probabilities


def test_probabilities_may_hold_exact_zeros():
    """Rows that are distributions over the class axis (1): an exact 0 is a probability, a negative value or a
    row summing to 0.9 is not; a regression output never is."""
    problem = SimpleNamespace(classification=True, class_axis=1)
    assert looks_like_probabilities(problem, torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0]]))
    assert not looks_like_probabilities(problem, torch.tensor([[1.1, -0.1, 0.0]]))
    assert not looks_like_probabilities(problem, torch.tensor([[0.5, 0.4, 0.0]]))
    assert not looks_like_probabilities(SimpleNamespace(classification=False, class_axis=1), torch.tensor([[1.0, 0.0]]))


def test_probabilities_rounded_to_4_decimals_are_probabilities():
    """1/3 written as 0.3333 (the row sums to 0.9999, 1e-4 short): a distribution; rows 1e-3 short are not."""
    problem = SimpleNamespace(classification=True, class_axis=1)
    assert looks_like_probabilities(problem, torch.tensor([[0.3333, 0.3333, 0.3333], [0.5, 0.25, 0.25]]))
    assert not looks_like_probabilities(problem, torch.tensor([[0.333, 0.333, 0.333]]))
