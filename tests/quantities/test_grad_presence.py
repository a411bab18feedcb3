"""``GradPresence``: the norm of the gradients present before backward (brute force: the gradients held
then), this pass's own norm, and the optimizer steps counted between two contexts."""

import copy

import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import GradPresence


def test_before_after_and_stepped_without_zero_grad():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    cp = Cockpit(model, [GradPresence()], diagnose=False)
    held, own = [], []
    for step in range(3):  # no zero_grad: gradients accumulate
        x = torch.randn(8, 5)
        held.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm().item()
                    if step else 0.0)
        loss = model(x).square().mean()
        grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
        own.append(torch.cat([g.reshape(-1) for g in grads]).norm().item())
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    for step in range(3):
        value = cp.output[step]["GradPresence"]
        assert value["before"] == pytest.approx(held[step], rel=1e-5)
        assert value["after"] == pytest.approx(own[step], rel=1e-5)
        assert value["stepped"] == (None if step == 0 else 1)
        assert (value["optimizer"], value["lr"], value["momentum"]) == ("SGD", 0.1, 0.5)


def test_steps_are_counted_on_untracked_steps_too():
    model = nn.Linear(3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    cp = Cockpit(model, [GradPresence(track_schedule=lambda s: s in (0, 4))], diagnose=False)
    for step in range(5):
        opt.zero_grad()
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
        if step == 2:
            opt.step()  # two updates between the contexts of steps 2 and 3
    value = cp.output[4]["GradPresence"]
    assert value["stepped"] == 1 and value["before"] == 0  # since step 3's context, not since step 0
    assert value["optimizer"] == "Adam" and value["momentum"] == 0.9


def test_several_optimizers_count_a_step_once_all_have_stepped():
    """``info["optimizer"] = [sgd, adam]``: one update of the model per round of their steps; the record names
    both, with the first one's learning rate and momentum."""
    model = nn.Linear(3, 2)
    optimizers = [torch.optim.SGD([model.weight], lr=0.1, momentum=0.5), torch.optim.Adam([model.bias], lr=1e-3)]
    cp = Cockpit(model, [GradPresence(track_schedule=lambda s: s in (0, 2))], diagnose=False)
    for step in range(3):
        for opt in optimizers:
            opt.zero_grad()
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(step, info={"loss": loss, "optimizer": optimizers}):
            loss.backward()
        for opt in optimizers:
            opt.step()
    value = cp.output[2]["GradPresence"]
    assert (value["optimizer"], value["lr"], value["momentum"], value["stepped"]) == ("SGD+Adam", 0.1, 0.5, 1)


def flat_norm(tensors):
    return torch.cat([t.reshape(-1) for t in tensors]).norm().item()


def test_every_update_between_two_contexts_is_counted():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [GradPresence()], diagnose=False)
    for step, updates in enumerate([1, 3, 0, 2]):
        opt.zero_grad()
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        for _ in range(updates):
            opt.step()
    assert [cp.output[s]["GradPresence"]["stepped"] for s in range(4)] == [None, 1, 3, 0]


def test_only_due_steps_are_recorded():
    model = nn.Linear(3, 1)
    cp = Cockpit(model, [GradPresence(track_schedule=lambda s: s in (0, 2))], diagnose=False)
    for step in range(4):
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
    assert sorted(s for s, e in cp.output.items() if "GradPresence" in e) == [0, 2]


def test_verbose_prints_each_value(capsys):
    for verbose, printed in ((False, False), (True, True)):
        model = nn.Linear(3, 1)
        cp = Cockpit(model, [GradPresence(verbose=verbose)] if verbose else [GradPresence()], diagnose=False)
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(0, info={"loss": loss}):
            loss.backward()
        assert ("GradPresence" in capsys.readouterr().out) == printed


def test_without_an_optimizer_the_model_gradients_are_read():
    """No zero_grad, no optimizer: ``before`` is the norm of what the tracked parameters (the model's) hold."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    cp = Cockpit(model, [GradPresence()], diagnose=False)
    held = []
    for step in range(2):
        held.append(flat_norm([p.grad for p in model.parameters()]) if step else 0.0)
        loss = model(torch.randn(6, 3)).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
    value = cp.output[1]["GradPresence"]
    assert value["before"] == pytest.approx(held[1], rel=1e-5) and held[1] > 0
    assert {k: value[k] for k in ("stepped", "optimizer", "lr", "momentum")} == \
        {"stepped": None, "optimizer": None, "lr": None, "momentum": None}


def test_with_an_optimizer_its_parameters_are_read():
    """The optimizer updates the head only; the body's (stale) gradients are not its concern."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    cp = Cockpit(model, [GradPresence()], diagnose=False)
    held = []
    for step in range(2):
        held.append(flat_norm([p.grad for p in model[2].parameters()]) if step else 0.0)
        loss = model(torch.randn(6, 3)).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()  # no zero_grad
    value = cp.output[1]["GradPresence"]
    assert value["before"] == pytest.approx(held[1], rel=1e-5)
    assert held[1] < flat_norm([p.grad for p in model.parameters()])  # the body's would add to it


class _RelativeStep(torch.optim.Optimizer):
    """A step size without a learning rate (as Adafactor's ``lr=None``): ``θ ← θ − 0.01 |θ| sign(g)``."""

    def __init__(self, params):
        super().__init__(params, {"lr": None})

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data.add_(-0.01 * p.data.abs() * p.grad.sign())


@pytest.mark.parametrize("make, expected", [
    (lambda p: torch.optim.Adagrad(p, lr=0.05), ("Adagrad", 0.05, None)),  # no momentum, no betas
    (_RelativeStep, ("_RelativeStep", None, None)),
])
def test_optimizers_without_a_learning_rate_or_momentum(make, expected):
    model = nn.Linear(3, 1)
    opt = make(model.parameters())
    cp = Cockpit(model, [GradPresence()], diagnose=False)
    loss = model(torch.randn(4, 3)).square().mean()
    with cp(0, info={"loss": loss, "optimizer": opt}):
        loss.backward()
    value = cp.output[0]["GradPresence"]
    assert (value["optimizer"], value["lr"], value["momentum"]) == expected


def test_first_backward_reads_what_the_first_pass_after_an_update_finds():
    """Accumulation over 3 micro-batches, the context around the last: ``before`` holds the first two
    micro-batches' gradients, ``first_backward`` is 0 after ``zero_grad`` and the stale update's gradient
    (brute force: the watched parameters' gradients right after ``opt.step()``) without it."""
    for zero_grad in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cp = Cockpit(model, [GradPresence()], diagnose=False)
        stale = [None]
        for step in range(3):
            if zero_grad:
                opt.zero_grad()
            for k in range(3):
                loss = model(torch.randn(8, 5)).square().mean()
                if k == 2:
                    with cp(step, info={"loss": loss, "optimizer": opt}):
                        loss.backward()
                else:
                    loss.backward()
            opt.step()
            stale.append(flat_norm([p.grad for p in model.parameters()]))
        for step in range(3):
            value = cp.output[step]["GradPresence"]
            assert value["before"] > 0 and value["stepped"] == (None if step == 0 else 1)
            if step == 0:
                assert value["first_backward"] is None  # no update seen yet
            elif zero_grad:
                assert value["first_backward"] == 0
            else:
                assert value["first_backward"] == pytest.approx(stale[step], rel=1e-5)


@pytest.mark.parametrize("numbered", ["consecutive", "skipping"])
def test_tensor_hooks_exist_only_before_a_due_step_and_a_missing_zero_grad_is_still_seen(numbered):
    """Due at steps 0 and 4 only: after the updates of steps 0-2 no parameter holds a hook (the
    next step is not due), after step 3's the watched ones do, and step 4's ``first_backward``
    finds step 3's stale gradient (no zero_grad). With step numbers that skip, the next step is
    not known: every update arms the hooks until the numbers run on by one again."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [GradPresence(track_schedule=lambda s: s in (0, 4, 12))], diagnose=False)
    steps = [0, 1, 2, 3, 4] if numbered == "consecutive" else [0, 2, 3, 4]
    hooked, stale = [], {}
    for step in steps:  # no zero_grad: the gradients of earlier batches stay
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        if step == 4:  # (the due step found its first backward pass: its hooks are gone with the context)
            assert not any(p._backward_hooks for p in model.parameters())
        stale[step] = flat_norm([p.grad for p in model.parameters()])
        opt.step()
        hooked.append(any(p._backward_hooks for p in model.parameters()))
    cp.close()
    # after the update of each step: armed only before step 4 (consecutive); once step 2 followed
    # step 0, after every update (the skip is seen at step 2's context, after step 0's update) until
    # step 3 follows step 2: then only before a due step again (step 4)
    expected = [False, False, False, True, False] if numbered == "consecutive" else [False, True, True, False]
    assert hooked == expected
    assert cp.output[4]["GradPresence"]["first_backward"] == pytest.approx(stale[3], rel=1e-5)


class _Branches(nn.Module):
    """Two Linear layers (4 parameter tensors, registered first) and ten more; the first two join in on even
    steps only."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
        self.b = nn.Sequential(*[nn.Linear(3, 3) for _ in range(10)])

    def forward(self, x, step):
        return self.b(self.a(x) if step % 2 == 0 else x)


def test_the_watched_parameters_are_spread_over_the_model():
    """24 parameter tensors hold a gradient after the update of step 0: the ``ARMED`` watched ones are spread
    over all of them, so step 1's pass, which skips the first branch, still reaches one and finds the stale
    gradients (no zero_grad): the norm of the watched tensors' gradients right after the update."""
    from cockpit_lite.quantities.grad_presence import ARMED

    torch.manual_seed(0)
    model = _Branches()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    cp = Cockpit(model, [GradPresence()], diagnose=False)
    for step in range(2):
        loss = model(torch.randn(4, 3), step).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
        if step == 0:
            stale = flat_norm([params[int(i * len(params) / ARMED)].grad for i in range(ARMED)])
    assert len(params) == 24 and cp.output[1]["GradPresence"]["first_backward"] == pytest.approx(stale, rel=1e-6)


def test_a_layer_frozen_between_backward_and_the_update_is_not_watched():
    """Its gradient stays after ``requires_grad_(False)``: a tensor that requires no gradient cannot take a hook,
    and training goes on (the update of step 0 arms the others)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [GradPresence()], diagnose=False)
    for step in range(2):
        loss = model(torch.randn(4, 3)).square().mean()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        model[0].requires_grad_(False)
        opt.step()
    assert model[0].weight.grad is not None and cp.output[1]["GradPresence"]["first_backward"] > 0


def test_the_saved_state_and_a_second_resume_before_any_step():
    """Due at steps 0 and 2. The saved state is the optimizer steps since the last ``cp(step)`` and whether
    the next window waits for its first backward pass: after step 0's update it does not (step 1 is not due,
    nothing is watched), after step 1's it does. A run resumed from it and saved again before its first step
    gives that state back, and a run resumed from this second save records step 2 as the uninterrupted run
    does: one update since step 1's context, and the first backward after ``zero_grad`` finds no gradient."""
    def run(state=None, steps=()):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cp = Cockpit(model, [GradPresence(track_schedule=lambda s: s in (0, 2))], diagnose=False)
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            cp.load_state_dict(state["cockpit"])
        saved = []
        for step in steps:
            opt.zero_grad()
            loss = model(torch.randn(4, 3, generator=torch.Generator().manual_seed(step))).square().mean()
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            opt.step()
            saved.append(copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                        "cockpit": cp.state_dict()}))
        return cp, saved

    fresh, _ = run()
    assert fresh.state_dict()["quantities"]["GradPresence"] == {"steps": None, "waiting": False}
    whole, saved = run(steps=range(3))
    assert [s["cockpit"]["quantities"]["GradPresence"] for s in saved[:2]] == [
        {"steps": 1, "waiting": False}, {"steps": 1, "waiting": True}]
    resumed, _ = run(saved[1])
    again = dict(saved[1], cockpit=resumed.state_dict())
    assert again["cockpit"]["quantities"]["GradPresence"] == {"steps": 1, "waiting": True}
    second, _ = run(again, steps=[2])
    value = second.output[2]["GradPresence"]
    assert value == whole.output[2]["GradPresence"]
    assert value["stepped"] == 1 and value["first_backward"] == 0


@pytest.mark.parametrize("state", [None, {"steps": 2}, {"steps": 2, "waiting": False, "other": 0}])
def test_a_saved_state_of_another_version_is_refused_naming_the_fix(state):
    with pytest.raises(ValueError, match=r"^GradPresence: the saved state is not this version's \({'steps', 'waiting'}\)\. "
                                         r"Fix: resume with the cockpit-lite version that saved the state$"):
        GradPresence().load_state_dict(state)
