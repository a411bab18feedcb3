"""``nonzero_gradients``: every trainable parameter gets a non-zero, finite gradient.

One backward pass of the loss on the batch through a copy (train mode); names
every parameter whose gradient is missing (``None``: a ``detach``, an unused layer,
a ``torch.no_grad`` block, an integer cast), exactly zero everywhere (dead ReLUs,
a multiplication by zero; a bidirectional RNN read at its last position only, whose
reverse recurrent weights then get none: the fix says so) or not finite, and every parameter with
``requires_grad=False``. Which parameters are trainable: those in the
``optimizer=`` passed to ``run`` (deliberately frozen ones left out of it are
not checked), else every parameter of the model. Threshold: no such parameter. A tensor
whose gradient is zero only because an exactly zero scale multiplies its branch (the
zero-initialised last BatchNorm of timm's residual blocks, LayerScale or ReZero at 0) is no
failure: one more backward pass of a copy with those scales at 1e-3 tells, and the message
names the scales.
"""

import torch

from .report import CheckResult

NAME = "nonzero_gradients"


def check(problem):
    """Backward once and list the parameters without a usable gradient."""
    model, _ = problem.copy()
    params = problem.trainable(model)
    if not params:
        return CheckResult.skip(NAME, "the model has no parameters")
    problem.loss_fn(model(problem.x), problem.y).backward()
    bad = {"frozen (requires_grad=False)": [], "no gradient (None)": [], "zero gradient": [],
           "non-finite gradient": []}
    for name, p in params:
        if not p.requires_grad:
            bad["frozen (requires_grad=False)"].append(name)
        elif p.grad is None:
            bad["no gradient (None)"].append(name)
        elif not bool(torch.isfinite(p.grad).all()):
            bad["non-finite gradient"].append(name)
        elif not bool(p.grad.any()):
            bad["zero gradient"].append(name)
    gates, behind = _behind_zero_scales(problem, bad["zero gradient"])
    bad["zero gradient"] = [name for name in bad["zero gradient"] if name not in behind]
    count = sum(len(names) for names in bad.values())
    waiting = (f"only once the exactly zero {_names(gates)} move (zero-initialised scales, as zero-init residual "
               "blocks start: no gradient reaches what they multiply until then)")
    if not count:
        return CheckResult(NAME, True, 0, "== 0", f"all {len(params)} parameter tensors get a gradient" +
                           (f", {len(behind)} of them {waiting}" if behind else ""))
    message = f"{count} of {len(params)} parameter tensors: " + "; ".join(
        f"{kind}: {', '.join(names)}" for kind, names in bad.items() if names) + (
        f"; {len(behind)} more get one {waiting}" if behind else "")
    fix = ("look between these parameters and the loss for .detach(), torch.no_grad(), .data, a layer that "
           "is built but never called, requires_grad=False set by mistake, or dead ReLUs (checks.reinit_dead_relus)")
    reverse = _reverse_read_last(model, bad["zero gradient"] + bad["no gradient (None)"])
    if reverse:
        fix = (f"{', '.join(reverse)}: a bidirectional RNN whose output is read at the last position only; its "
               "reverse direction starts there from a zero state, so its recurrent weights get no gradient: read "
               "the reverse half at the first position (out[:, 0, hidden:] with batch_first) or use h_n; " + fix)
    return CheckResult(NAME, False, count, "== 0", message, fix)


def _behind_zero_scales(problem, zero):
    """``(gates, behind)``: the trainable tensors that are exactly zero, and those of ``zero`` (names with an
    exactly zero gradient) that get a gradient once the gates are 1e-3 (a fresh copy, one more backward
    pass): a branch a zero-initialised scale multiplies (the last BatchNorm of timm's residual blocks,
    LayerScale or ReZero at 0) gets no gradient until the scale moves, by design."""
    if not zero:
        return [], set()
    model, _ = problem.copy()
    params = problem.trainable(model)
    gates = [name for name, p in params if p.requires_grad and p.numel() and not bool(p.detach().any())]
    gates.sort(key=lambda name: not name.endswith("weight"))  # scales first, zero-initialised biases after
    if not gates:
        return [], set()
    with torch.no_grad():
        for name, p in params:
            if name in gates:
                p.fill_(1e-3)
    problem.loss_fn(model(problem.x), problem.y).backward()
    grads = {name: p.grad for name, p in params}
    return gates, {name for name in zero if grads.get(name) is not None and bool(grads[name].any())}


def _names(names, shown=3):
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _reverse_read_last(model, names):
    """The names among ``names`` of a bidirectional RNN's reverse recurrent weights (``weight_hh_l{k}_reverse``)."""
    found = []
    for name in names:
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        if isinstance(module, torch.nn.RNNBase) and module.bidirectional and leaf.startswith("weight_hh_l") \
                and leaf.endswith("_reverse"):
            found.append(name)
    return found
