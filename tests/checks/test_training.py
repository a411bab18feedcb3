"""``training``: the helpers of the checks that train a copy of the model."""

from types import SimpleNamespace

import torch

from cockpit_lite.checks.training import looks_like_probabilities, train


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


def test_training_stops_at_a_loss_equal_to_the_target_and_after_the_last_update():
    """Scripted losses 3, 2, 1, 0.5: with target 1 the third loss (exactly 1) ends it after two updates; with
    none, ``steps`` updates and one more loss; a non-finite loss ends it before its update."""
    for script, steps, target, seen, updates in [([3.0, 2.0, 1.0, 0.5], 5, 1.0, [3.0, 2.0, 1.0], 2),
                                                 ([3.0, 2.0, 1.0, 0.5], 2, None, [3.0, 2.0, 1.0], 2),
                                                 ([3.0, float("inf"), 1.0], 5, None, [3.0, float("inf")], 1)]:
        weight = torch.nn.Parameter(torch.zeros(()))
        values = iter(script)
        optimizer = torch.optim.SGD([weight], lr=1.0)
        loss_fn = lambda output, y: output + next(values) + (weight - weight.detach())  # noqa: E731  (gradient 1)
        assert train(lambda x: torch.zeros(()), loss_fn, None, None, optimizer, steps, target) == seen
        assert weight.item() == -updates
