"""``isolation``: the checks' optimizer is a new one with the user's hyper-parameters, never the user's."""

import torch

from cockpit_lite.checks.isolation import fresh_optimizer


def test_a_passed_optimizer_is_copied_with_its_hyper_parameters():
    users = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.123, momentum=0.9, weight_decay=0.01)
    params = [torch.nn.Parameter(torch.zeros(3))]
    fresh = fresh_optimizer(users, params, default=lambda p: torch.optim.Adam(p))
    assert type(fresh) is torch.optim.SGD and fresh is not users
    group = fresh.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.123, 0.9, 0.01)
    assert group["params"] == params
