"""Update prediction: equals the real step and leaves the optimizer untouched."""

import copy

import pytest
import torch

from cockpit_lite.optim import UpdatePredictor, plain_sgd_learning_rate

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_nesterov_wd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.5),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-1),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_prediction_equals_the_real_update_bit_for_bit(name):
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(3, 4, generator=g, requires_grad=True), torch.randn(5, generator=g, requires_grad=True)]
    opt = OPTIMIZERS[name](params)
    for _ in range(3):  # build up optimizer state
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        state_before = copy.deepcopy(opt.state_dict())
        before = [p.detach().clone() for p in params]
        predicted = [UpdatePredictor(opt)(p, p.grad.clone()) for p in params]
        assert str(opt.state_dict()) == str(state_before)
        assert all(torch.equal(p, b) for p, b in zip(params, before))
        opt.step()
        for p, b, d in zip(params, before, predicted):
            assert torch.equal((p.detach() - b).reshape(-1), d)


def test_foreign_parameter_is_named():
    opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        UpdatePredictor(opt)(torch.zeros(3, requires_grad=True), torch.zeros(3))


def test_plain_sgd_learning_rate():
    p = [torch.zeros(2, requires_grad=True)]
    assert plain_sgd_learning_rate(torch.optim.SGD(p, lr=0.3), "CABS") == 0.3
    with pytest.raises(ValueError, match="CABS is defined for plain SGD"):
        plain_sgd_learning_rate(torch.optim.SGD(p, lr=0.3, momentum=0.1), "CABS")
    with pytest.raises(ValueError, match="one learning rate"):
        plain_sgd_learning_rate(
            torch.optim.SGD([{"params": p, "lr": 0.1}, {"params": [torch.zeros(1, requires_grad=True)]}], lr=0.2),
            "CABS",
        )
