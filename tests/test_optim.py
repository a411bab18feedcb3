"""Update prediction: equals the real step and leaves the optimizer untouched."""

import copy

import pytest
import torch

from cockpit_lite.optim import UpdatePredictor, joined, plain_sgd_learning_rate

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


def test_several_optimizers_are_one_whose_hooks_wait_for_the_round_of_their_steps():
    """``joined([a, b])``: their groups and state, the same object for the same optimizers; a pre-hook runs
    before the first of them steps, a post-hook once both have stepped, once per round; removed, no hook of
    cockpit-lite's is left on them. Each parameter's update is predicted by the one that updates it."""
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(2, 2, generator=g, requires_grad=True), torch.randn(3, generator=g, requires_grad=True)
    a, b = torch.optim.SGD([p], lr=0.1, momentum=0.9), torch.optim.Adam([q], lr=0.1)
    both = joined([a, b])
    assert joined((a, b)) is both and joined([a]) is a and joined(a) is a
    assert [group["params"][0] for group in both.param_groups] == [p, q]
    calls = []
    pre = both.register_step_pre_hook(lambda opt, args, kwargs: calls.append(("pre", opt is both)))
    post = both.register_step_post_hook(lambda opt, args, kwargs: calls.append(("post", opt is both)))
    for _ in range(2):
        p.grad, q.grad = torch.randn(2, 2, generator=g), torch.randn(3, generator=g)
        before = [p.detach().clone(), q.detach().clone()]
        predicted = [UpdatePredictor(both)(t, t.grad.clone()) for t in (p, q)]
        a.step()
        calls.append("a")
        b.step()
        calls.append("b")
        for t, was, d in zip((p, q), before, predicted):
            assert torch.equal((t.detach() - was).reshape(-1), d)
    assert calls == [("pre", True), "a", ("post", True), "b"] * 2
    assert {id(t) for t in both.state} == {id(p), id(q)}
    pre.remove()
    post.remove()
    assert not any(o._optimizer_step_pre_hooks or o._optimizer_step_post_hooks for o in (a, b))


def test_a_parameter_no_optimizer_updates_names_the_fix():
    """The fix the message names (every optimizer, as a list) predicts the update."""
    w, v = torch.zeros(2, 2, requires_grad=True), torch.zeros(2, requires_grad=True)
    a, b = torch.optim.SGD([w], lr=0.1), torch.optim.SGD([v], lr=0.2)
    with pytest.raises(ValueError, match=r"info\['optimizer'\] = \[optimizer_a, optimizer_b\]"):
        UpdatePredictor(a)(v, torch.ones(2))
    assert torch.equal(UpdatePredictor(joined([a, b]))(v, torch.ones(2)), torch.full((2,), -0.2))


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


def real_update(opt, params, grads):
    """The update ``opt.step()`` makes (the optimizer and parameters restored afterwards)."""
    state, before = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    updates = [(p.detach() - b).reshape(-1) for p, b in zip(params, before)]
    opt.load_state_dict(state)
    with torch.no_grad():
        for p, b in zip(params, before):
            p.copy_(b)
    return updates


def test_group_keys_the_constructor_does_not_take_are_left_out():
    """An LR scheduler adds 'initial_lr' to the groups; Adam(..., initial_lr=...) would be a TypeError."""
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(4, generator=g, requires_grad=True)]
    opt = torch.optim.Adam(params, lr=1e-2)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    assert "initial_lr" in opt.param_groups[0]
    grad = torch.randn(4, generator=g)
    assert torch.equal(UpdatePredictor(opt)(params[0], grad), real_update(opt, params, [grad])[0])


class ScaledSGD(torch.optim.SGD):
    """An optimizer whose constructor takes ``**kwargs`` (every group key is passed on)."""

    def __init__(self, params, lr=0.1, scale=1.0, **kwargs):
        super().__init__(params, lr=lr, **kwargs)
        for group in self.param_groups:
            group.setdefault("scale", scale)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"] * group["scale"])


def test_an_optimizer_taking_kwargs_gets_every_hyperparameter():
    g = torch.Generator().manual_seed(2)
    params = [torch.randn(3, generator=g, requires_grad=True)]
    opt = ScaledSGD(params, lr=0.1, scale=3.0, momentum=0.5)
    grad = torch.randn(3, generator=g)
    predicted = UpdatePredictor(opt)(params[0], grad)
    assert torch.equal(predicted, real_update(opt, params, [grad])[0])
    torch.testing.assert_close(predicted, -0.3 * grad)


@pytest.mark.parametrize("name", ["sgd", "adam_amsgrad"])
def test_gradient_of_another_dtype_and_shape(name):
    """The individual-gradient machinery may hand over a float64, flattened gradient of a float32 parameter."""
    g = torch.Generator().manual_seed(3)
    params = [torch.randn(2, 3, generator=g, requires_grad=True)]
    opt = OPTIMIZERS[name](params)
    grad = torch.randn(2, 3, generator=g)
    predicted = UpdatePredictor(opt)(params[0], grad.double().reshape(-1))
    assert predicted.dtype == torch.float32 and predicted.shape == (6,)
    assert torch.equal(predicted, real_update(opt, params, [grad])[0])


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.SGD(p, lr=0.3, weight_decay=0.1),
        lambda p: torch.optim.SGD(p, lr=0.3, maximize=True),
        lambda p: torch.optim.SGD(p, lr=torch.tensor(0.3)),
        lambda p: torch.optim.Adam(p, lr=0.3),
    ],
    ids=["weight_decay", "maximize", "tensor_lr", "adam"],
)
def test_not_plain_sgd_is_refused_and_still_predicted(make):
    """Each of these steps differs from θ − η g (or is not SGD): no plain-SGD learning rate, and the
    prediction (not the shortcut) equals the real update."""
    g = torch.Generator().manual_seed(4)
    params = [torch.randn(5, generator=g, requires_grad=True)]
    opt = make(params)
    with pytest.raises(ValueError, match="CABS is defined for plain SGD"):
        plain_sgd_learning_rate(opt, "CABS")
    grad = torch.randn(5, generator=g)
    assert torch.equal(UpdatePredictor(opt)(params[0], grad), real_update(opt, params, [grad])[0])


def test_plain_sgd_with_equal_rates_in_several_groups():
    p, q = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [p]}, {"params": [q], "lr": 0.25}], lr=0.25)
    assert plain_sgd_learning_rate(opt, "CABS") == 0.25
