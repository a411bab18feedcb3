"""``gradient_check``: analytic gradients agree with central finite differences (float64).

Catches a wrong ``torch.autograd.Function.backward`` (or any custom gradient), and a
graph cut inside ``forward`` (a ``.detach()``, ``torch.no_grad()``, ``.data``): the
differences run through the whole forward pass, so they see the dependence autograd
drops. Every trainable parameter is checked, those autograd gives no gradient (``None``
or all zero) too: ``DETACHED_ENTRIES = 12`` entries drawn uniformly, analytic gradient 0.
The ``padding_idx`` row of an embedding is left out: PyTorch gives it no gradient by
design, though the loss depends on it wherever the batch pads.
A float64 copy of the model (dropout off; tensors the model creates in
``forward`` are float64 too, the default dtype is switched for the check and
restored) and the loss on the first ``SAMPLES = 8`` samples; for every parameter
tensor, ``ENTRIES = 3`` entries drawn uniformly plus 3 among those with a
non-zero analytic gradient (where a wrong backward shows; drawn as ``checks.run``'s
``seed`` draws) are compared with
``(L(θ + ε) − L(θ − ε)) / 2ε`` at ``ε = 1e-6``.

Error of an entry: ``|numerical − analytic| / max(|numerical|, |analytic|, 1e-3 · g_max)``
with ``g_max`` the largest analytic gradient entry, so that entries with tiny
gradients are judged against the scale of the whole gradient. Threshold
``<= 1e-4``: in float64 the truncation error (ε² · L''') and the rounding error
(1e-16 · L / ε) are both about 1e-10, while a wrong backward is off by O(1).
An entry that disagrees is tried again at ε / 10 and counts only if it still
disagrees: a kink (a ReLU or max-pool switching inside ±ε) gives a spurious
difference that does not survive the smaller step. A parameter tensor that is exactly
zero (a zero-initialised scale or bias) is compared at ``NUDGE = 1e-3`` times normal
values instead: at zero a scale can sit on a kink for every ε (``_nudge_zeros``). The result names the
parameter that disagrees most.
"""

import copy

import torch
from torch import nn

from .report import CheckResult

NAME = "gradient_check"
SAMPLES = 8
ENTRIES = 3
DETACHED_ENTRIES = 12
EPS = 1e-6
TOLERANCE = 1e-4
SCALE_FLOOR = 1e-3
NUDGE = 1e-3


class _DefaultDtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.previous)


def _as64(tensor):
    return tensor.double() if torch.is_floating_point(tensor) else tensor


def _entries(grad, free):
    """Flat indices to compare: among the entries ``free`` (a flat mask) allows, some drawn uniformly
    and some with a non-zero analytic gradient (or, with none, ``DETACHED_ENTRIES`` of them); drawn from the
    global random state, which ``checks.run`` forks and seeds (``seed=``)."""
    flat = grad.reshape(-1)
    allowed = torch.nonzero(free).reshape(-1)
    if not bool(flat[allowed].any()):  # no analytic gradient: where does the loss still depend on it?
        return allowed[torch.randperm(allowed.numel())[:DETACHED_ENTRIES]].tolist()
    picked = allowed[torch.randperm(allowed.numel())[:ENTRIES]]
    nonzero = allowed[flat[allowed] != 0]
    extra = nonzero[torch.randperm(nonzero.numel())[:ENTRIES]]
    return torch.unique(torch.cat([picked, extra])).tolist()


def _free(model, name, param):
    """The flat mask of the entries of ``param`` whose gradient autograd computes: all but the
    ``padding_idx`` row of an ``nn.Embedding``/``nn.EmbeddingBag``'s weight, which PyTorch leaves
    without a gradient by design although the loss depends on it wherever the batch pads."""
    free = torch.ones(param.numel(), dtype=torch.bool)
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    padding = getattr(module, "padding_idx", None)
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and leaf == "weight" and padding is not None:
        free.view(param.shape)[padding] = False
    return free


def _nudge_zeros(params):
    """Move every parameter tensor that is exactly zero (a zero-initialised scale or bias) to ``NUDGE``
    times standard normal values; returns how many. At zero such a scale sits on a kink for every ε
    (the last BatchNorm of timm's residual blocks starts at zero: its branch adds exactly 0 before a
    ReLU whose zero inputs any change moves across), where autograd's subgradient matches neither
    one-sided slope; a little away from it the function is smooth and the comparison decides."""
    count = 0
    with torch.no_grad():
        for _, p in params:
            if not bool(p.any()):
                p.copy_(NUDGE * torch.randn(p.shape, dtype=p.dtype))
                count += 1
    return count


def _numerical(loss_at, flat, i, eps):
    original = flat[i].item()
    flat[i] = original + eps
    plus = loss_at()
    flat[i] = original - eps
    minus = loss_at()
    flat[i] = original
    return (plus - minus) / (2 * eps)


def check(problem):
    """Compare analytic and central-difference gradients on sampled parameter entries."""
    x, y = map(_as64, problem.small_batch(SAMPLES))
    loss_fn = copy.deepcopy(problem.loss_fn).double() if isinstance(problem.loss_fn, nn.Module) else problem.loss_fn
    with _DefaultDtype(torch.float64):
        model, _ = problem.copy(dropout=False, dtype=torch.float64)
        params = [(n, p) for n, p in problem.trainable(model) if p.requires_grad and p.numel()]  # (no empty tensor)
        nudged = _nudge_zeros(params)
        try:
            loss = loss_fn(model(x), y)
            if loss.requires_grad:  # (else the graph reaches no parameter: the gradients stay None)
                loss.backward()
        except RuntimeError as error:
            return CheckResult.skip(NAME, f"the model does not run in float64 ({error})")
        grads = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
        if not grads or max(float(g.abs().max()) for g in grads.values()) == 0:
            return CheckResult.skip(NAME, "no parameter gets a non-zero gradient (see nonzero_gradients)")
        scale = SCALE_FLOOR * max(float(g.abs().max()) for g in grads.values())
        for n, p in params:  # autograd's graph does not reach them: the analytic gradient is 0
            if n not in grads:
                grads[n] = torch.zeros_like(p)

        @torch.no_grad()
        def loss_at():
            return float(loss_fn(model(x), y))

        worst, checked = (0.0, None), 0
        with torch.no_grad():
            for name, p in params:
                if name not in grads or not p.is_contiguous():
                    continue
                flat, analytic = p.view(-1), grads[name].reshape(-1)
                for i in _entries(grads[name], _free(model, name, p)):
                    checked += 1
                    a = analytic[i].item()
                    errors = []
                    for eps in (EPS, EPS / 10):
                        n = _numerical(loss_at, flat, i, eps)
                        errors.append(abs(n - a) / max(abs(n), abs(a), scale))
                        if errors[-1] <= TOLERANCE:
                            break
                    error = min(errors)
                    if error > worst[0]:
                        index = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), p.shape))
                        worst = (error, (name, index, a, n))
    passed = worst[0] <= TOLERANCE
    if passed:
        message = f"{checked} entries of {len(grads)} parameter tensors agree (largest error {worst[0]:.1e})"
        if nudged:
            message += f"; {nudged} tensors that were exactly zero compared at {NUDGE:g} x normal values"
        return CheckResult(NAME, True, worst[0], f"<= {TOLERANCE:g}", message)
    name, index, a, n = worst[1]
    message = (f"`{name}` disagrees: analytic {a:.4g} vs numerical {n:.4g} at index {index} "
               f"(error {worst[0]:.2g})")
    fix = (f"a custom backward (torch.autograd.Function) between `{name}` and the loss returns a wrong "
           "gradient: compare it with torch.autograd.gradcheck")
    if a == 0 and not bool(grads[name].any()):
        message = (f"autograd gives `{name}` no gradient, but the loss depends on it: numerical {n:.4g} at "
                   f"index {index}")
        fix = (f"the graph is cut between `{name}` and the loss: look for a .detach(), torch.no_grad(), .data or "
               "a conversion to NumPy/Python numbers in forward")
    return CheckResult(NAME, False, worst[0], f"<= {TOLERANCE:g}", message, fix)
