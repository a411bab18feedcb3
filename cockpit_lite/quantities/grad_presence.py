"""``GradPresence``: gradients already present when backward started, and optimizer steps since.

Read before the backward pass (``needs``): ``before = ‖g_present‖₂``, the norm of the
gradients the parameters hold when the step's backward pass starts (0 when they are
``None`` or zero, as after ``optimizer.zero_grad()``). After it: ``after = ‖g‖₂`` of this
backward pass alone. ``stepped`` counts the calls of ``info["optimizer"].step()``
since the previous step's context ``cp(step)`` (counted at every step, due or not: a
post-step hook registered on the optimizer the first time it is seen; ``None`` before
that, or without an optimizer), so that a sparse schedule does not count the updates
of untracked steps. ``before > 0`` with ``stepped ≥ 1`` means the gradients of an earlier batch,
already used for an update, are being added to: a missing ``zero_grad``. Deliberate
gradient accumulation has ``stepped = 0`` between its micro-batches.

Also recorded from the optimizer's first parameter group, for the rules that compare
a step size with curvature: ``optimizer`` (class name), ``lr`` and ``momentum`` (SGD's
``momentum``, Adam's ``betas[0]``).
"""

import torch

from cockpit_lite.quantities.base import Needs, Output, Quantity


class GradPresence(Quantity):
    """``{"before", "after", "stepped", "optimizer", "lr", "momentum"}`` per step."""

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._optimizer = None
        self._handle = None
        self._steps = 0
        self._pending = None

    def unbind(self):
        if self._handle is not None:
            self._handle.remove()
        self._handle, self._optimizer = None, None

    def _on_step(self, optimizer, args, kwargs):
        self._steps += 1

    def needs(self, step, info):
        optimizer = info.get("optimizer")
        stepped = None
        if isinstance(optimizer, torch.optim.Optimizer):  # counted at every step, due or not
            if optimizer is self._optimizer:
                stepped = self._steps
            else:
                self.unbind()
                self._optimizer = optimizer
                self._handle = optimizer.register_step_post_hook(self._on_step)
            self._steps = 0
        if not self.is_due(step):
            return None
        present = [p.grad.detach() for group in _groups(info, optimizer) for p in group if p.grad is not None]
        before = torch.stack(torch._foreach_norm(present)).norm() if present else 0.0
        self._pending = (before, stepped, _hyperparameters(optimizer))
        return Needs()

    def compute(self, step, data):
        if self._pending is None:
            return None
        before, stepped, hyper = self._pending
        self._pending = None
        after = torch.stack(data.grad_norms).norm() if data.grads else 0.0
        return Output({"before": before, "after": after, "stepped": stepped, **hyper})


def _groups(info, optimizer):
    if isinstance(optimizer, torch.optim.Optimizer):
        return [group["params"] for group in optimizer.param_groups]
    model = info.model
    return [list(model.parameters())] if model is not None else []


def _hyperparameters(optimizer):
    if not isinstance(optimizer, torch.optim.Optimizer):
        return {"optimizer": None, "lr": None, "momentum": None}
    group = optimizer.param_groups[0]
    lr = group.get("lr")
    momentum = group.get("momentum", (group.get("betas") or (None,))[0])
    return {
        "optimizer": type(optimizer).__name__,
        "lr": float(lr) if lr is not None else None,
        "momentum": float(momentum) if momentum is not None else None,
    }
