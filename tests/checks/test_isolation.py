"""``isolation``: the checks' optimizer is a new one with the user's hyper-parameters, never the user's."""

import itertools

import pytest
import torch

from cockpit_lite.checks.isolation import endless, fresh_optimizer


def test_a_passed_optimizer_is_copied_with_its_hyper_parameters():
    users = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.123, momentum=0.9, weight_decay=0.01)
    params = [torch.nn.Parameter(torch.zeros(3))]
    fresh = fresh_optimizer(users, params, default=lambda p: torch.optim.Adam(p))
    assert type(fresh) is torch.optim.SGD and fresh is not users
    group = fresh.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.123, 0.9, 0.01)
    assert group["params"] == params


def test_endless_refuses_empty_batches():
    """A loader that yields nothing raises on its first pass instead of looping forever (a second pass fails
    the test rather than hanging it)."""
    class Empty:
        passes = 0

        def __iter__(self):
            self.passes += 1
            assert self.passes == 1, "endless went over an empty loader again"
            return iter(())

    with pytest.raises(ValueError, match="batches is empty"):
        next(endless(Empty()))
    with pytest.raises(ValueError, match="batches is empty"):
        next(endless([]))


def test_endless_repeats_one_pair_a_tuple_of_pairs_or_a_loader():
    """One ``(x, y)`` pair is one batch; a tuple of two pairs is two batches; a loader (not indexable) is read
    as it iterates."""
    first, second = (torch.zeros(2, 1), torch.zeros(2)), (torch.ones(2, 1), torch.ones(2))
    assert all(batch is first for batch in itertools.islice(endless(first), 3))
    assert [batch is first for batch in itertools.islice(endless((first, second)), 3)] == [True, False, True]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(4.0)[:, None], torch.arange(4.0)),
                                         batch_size=2)
    assert [y.tolist() for _, y in itertools.islice(endless(loader), 3)] == [[0.0, 1.0], [2.0, 3.0], [0.0, 1.0]]
