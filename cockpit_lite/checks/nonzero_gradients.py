"""``nonzero_gradients``: every trainable parameter gets a non-zero, finite gradient.

One backward pass of the loss on the batch through a copy (train mode); names
every parameter whose gradient is missing (``None``: a ``detach``, an unused layer,
a ``torch.no_grad`` block, an integer cast), exactly zero everywhere (dead ReLUs,
a multiplication by zero; a bidirectional RNN read at its last position only, whose
reverse recurrent weights then get none: the fix says so) or not finite, and every parameter with
``requires_grad=False``. Which parameters are trainable: those in the
``optimizer=`` passed to ``run`` (deliberately frozen ones left out of it are
not checked), else every parameter of the model. Threshold: no such parameter.
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
    count = sum(len(names) for names in bad.values())
    if not count:
        return CheckResult(NAME, True, 0, "== 0", f"all {len(params)} parameter tensors get a gradient")
    message = f"{count} of {len(params)} parameter tensors: " + "; ".join(
        f"{kind}: {', '.join(names)}" for kind, names in bad.items() if names)
    fix = ("look between these parameters and the loss for .detach(), torch.no_grad(), .data, a layer that "
           "is built but never called, requires_grad=False set by mistake, or dead ReLUs (checks.reinit_dead_relus)")
    reverse = _reverse_read_last(model, bad["zero gradient"] + bad["no gradient (None)"])
    if reverse:
        fix = (f"{', '.join(reverse)}: a bidirectional RNN whose output is read at the last position only; its "
               "reverse direction starts there from a zero state, so its recurrent weights get no gradient: read "
               "the reverse half at the first position (out[:, 0, hidden:] with batch_first) or use h_n; " + fix)
    return CheckResult(NAME, False, count, "== 0", message, fix)


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
