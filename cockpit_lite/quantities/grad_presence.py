"""``GradPresence``: gradients already present when backward started, and optimizer steps since.

Read before the backward pass (``needs``): ``before = ‖g_present‖₂``, the norm of the
gradients the parameters hold when the step's backward pass starts (those ``info["optimizer"]``
updates, else the tracked ones; 0 when they are ``None`` or zero, as after
``optimizer.zero_grad()``). After it: ``after = ‖g‖₂`` of this backward pass alone. ``stepped`` counts the calls of ``info["optimizer"].step()``
since the previous step's context ``cp(step)`` (counted at every step, due or not: a
post-step hook registered on the optimizer the first time it is seen; ``None`` before
that, or without an optimizer), so that a sparse schedule does not count the updates
of untracked steps.

``first_backward`` answers the question a missing ``zero_grad`` raises, whatever the
micro-batch ``cp(step)`` is around: the norm of the gradients the parameters held when
the *first* backward pass after the latest optimizer step reached them (0: they were
zeroed or ``None``, as after ``zero_grad``; ``None``: no optimizer step seen yet). After
each ``optimizer.step()`` whose next ``cp(step)`` is due (every one once the step numbers
skipped, since the next one is not known then) a tensor hook is put on up to ``ARMED``
parameters that hold a gradient (it runs before autograd adds the new gradient in); the
first one to fire reads the gradients those parameters still hold and all are removed.
Between due steps nothing is armed: a sparse schedule costs its untracked steps no hook. Deliberate
gradient accumulation (``zero_grad`` once per optimizer step, ``cp(step)`` around the
last micro-batch's backward) has ``before > 0`` and ``stepped = 1`` (the previous
window's update) but ``first_backward = 0``; a loop without ``zero_grad`` has
``first_backward > 0``: the gradients of batches already used for an update are added to.

Saved state (``state_dict``): the optimizer steps counted since the last ``cp(step)`` and
whether the window still waits for its first backward pass. A resumed run's first
optimizer (a new object) continues that count, and a waiting window is watched on the
tracked parameters (a fresh model holds no gradient: ``first_backward`` is 0 there, as
after ``zero_grad``).

Also recorded from the optimizer's first parameter group, for the rules that compare
a step size with curvature: ``optimizer`` (class name), ``lr`` and ``momentum`` (SGD's
``momentum``, Adam's ``betas[0]``).
"""

import torch

from cockpit_lite.optim import members
from cockpit_lite.quantities.base import Needs, Output, Quantity
from cockpit_lite.utils.grads import held
from cockpit_lite.utils.norms import norms

ARMED = 8
"""Parameters watched for the first backward pass after an optimizer step."""


class GradPresence(Quantity):
    """``{"before", "after", "stepped", "first_backward", "optimizer", "lr", "momentum"}`` per step."""

    TIER = 0  # (overhead budget: bookkeeping)

    SCALED_BACKWARD = True

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._optimizer = None
        self._handle = None
        self._steps = 0
        self._pending = None
        self._armed = []
        self._first = None
        self._windows = 0  # optimizer steps ever seen: names the window a hook was armed in
        self._params = []  # the Cockpit's tracked parameters
        self._continued = None  # a resumed run: the saved count, for the first optimizer seen
        self._steps_seen = lambda: (None, False)  # (the latest cp(step), whether the step numbers ever skipped one)
        self._stand_ins = lambda: {}  # FSDP2: the tensors autograd reaches instead of the (sharded) parameters

    def bind(self, cockpit):
        """Remember the tracked parameters (a resumed window is watched on them) and, on a model sharded
        by FSDP2, where its parameters' gradients arrive (its unsharded parameters: FSDP2 sets the
        sharded ones' gradients itself, autograd never reaches them)."""
        self._params = cockpit.params
        # the Cockpit's count (saved with its state; it sees the overhead budget's bare steps, whose
        # needs are never asked): after a skip the next step is unknown
        self._steps_seen = lambda: (cockpit._last_step, cockpit._jumped)
        group = cockpit.group
        if group is not None and group.sharded:
            self._stand_ins = lambda: {id(p): u for u, p in group.stand_ins(cockpit.model)}

    def state_dict(self):
        """``{"steps": optimizer steps since the last cp(step) (None: no optimizer seen), "waiting": bool}``.

        Before its first optimizer a resumed quantity gives back the state it was loaded with (the
        count it will continue; its window armed by ``load_state_dict``)."""
        steps = self._steps if self._optimizer is not None else self._continued
        return {"steps": steps, "waiting": bool(self._armed) and self._first is None}

    def load_state_dict(self, state):
        """Continue the saved count with the next optimizer seen; watch a waiting window's first backward pass."""
        if not isinstance(state, dict) or set(state) != {"steps", "waiting"}:
            raise ValueError(f"{self.name}: the saved state is not this version's ({{'steps', 'waiting'}}). "
                             "Fix: resume with the cockpit-lite version that saved the state")
        self._continued = state["steps"]
        if state["waiting"]:
            self._arm([p for p in self._params if p.requires_grad])

    def unbind(self):
        if self._handle is not None:
            self._handle.remove()
        self._disarm()
        self._handle, self._optimizer, self._first = None, None, None

    def _disarm(self):
        for handle in self._armed:
            handle.remove()
        self._armed = []

    def _on_step(self, optimizer, args, kwargs):
        self._steps += 1
        self._windows += 1
        self._disarm()
        self._first = None  # a new window: unknown until its first backward pass
        last, skipped = self._steps_seen()
        if last is None or skipped or self.is_due(last + 1):
            self._arm([p for group in optimizer.param_groups for p in group["params"]
                       if p.requires_grad and p.grad is not None])

    def _arm(self, watched):
        if not watched:
            return
        if len(watched) > ARMED:  # spread over the model: one branch left out of a pass does not hide them all
            stride = len(watched) / ARMED
            watched = [watched[int(i * stride)] for i in range(ARMED)]
        stand_ins = self._stand_ins()
        self._armed = [stand_ins.get(id(p), p).register_hook(self._reached(watched)) for p in watched]

    def _reached(self, watched):
        window = self._windows

        def hook(grad):
            # the first watched parameter reached in this window: nothing was added to any of them yet
            # (the handles are removed later, never while autograd runs the hooks)
            if self._first is None and self._windows == window:
                present = [held(p) for p in watched if p.grad is not None]
                self._first = torch.stack(norms(present)).norm() if present else 0.0
            return None

        return hook

    def needs(self, step, info):
        optimizer = info.get("optimizer")
        stepped = None
        if isinstance(optimizer, torch.optim.Optimizer):  # counted at every step, due or not
            if optimizer is self._optimizer:
                stepped = self._steps
            else:
                if self._optimizer is not None:  # another optimizer: start over
                    self.unbind()
                stepped, self._continued = self._continued, None
                self._optimizer = optimizer
                self._handle = optimizer.register_step_post_hook(self._on_step)
            self._steps = 0
        if not self.is_due(step):
            return None
        groups = [g["params"] for g in optimizer.param_groups] if isinstance(optimizer, torch.optim.Optimizer) else [
            self._params]  # (without an optimizer: the tracked parameters)
        present = [held(p) for group in groups for p in group if p.grad is not None]
        before = torch.stack(norms(present)).norm() if present else 0.0
        self._pending = (before, stepped, _hyperparameters(optimizer))
        return Needs()

    def compute(self, step, data):
        if self._pending is None:
            return None
        before, stepped, hyper = self._pending
        self._pending = None
        after = torch.stack(data.grad_norms).norm()  # (a Cockpit tracks at least one parameter)
        first = self._first if self._optimizer is not None else None
        if first is not None:
            self._disarm()
        return Output({"before": before, "after": after, "stepped": stepped, "first_backward": first, **hyper})


def _hyperparameters(optimizer):
    if not isinstance(optimizer, torch.optim.Optimizer):
        return {"optimizer": None, "lr": None, "momentum": None}
    group = optimizer.param_groups[0]
    lr = group.get("lr")
    momentum = group.get("momentum", (group.get("betas") or (None,))[0])
    return {
        "optimizer": "+".join(type(member).__name__ for member in members(optimizer)),
        "lr": float(lr) if lr is not None else None,
        "momentum": float(momentum) if momentum is not None else None,
    }
