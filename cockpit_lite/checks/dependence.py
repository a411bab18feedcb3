"""What the output depends on: the machinery of the batch-independence and causal checks.

Both families ask the same question of a copy of the model, for a few pairs
(source, forbidden) of index sets:

- forward: change the inputs at ``forbidden``; the outputs at ``source`` must not
  move. Both forward passes start from the same random seed, so dropout draws the
  same masks and only a real dependence can move the output.
- backward: the gradient of a random projection of the outputs at ``source`` with
  respect to the inputs (or, for integer tokens, the output of the input
  embedding) must be exactly zero at ``forbidden``.

Both report a relative leak: the largest change (gradient) at the forbidden
places divided by the largest output (gradient at the allowed places). Exact
independence gives 0 up to float rounding; the threshold ``LEAK`` (1e-5) is far
above float32 rounding of a single sample's computation and far below any
real mixing (``x - x.mean(0)`` over a batch of 8 leaks about 1e-1).
"""

import torch

from .report import CheckResult

LEAK = 1e-5
THRESHOLD = f"<= {LEAK:g}"
_SEED = 12345


def _seeded(model, x):
    torch.manual_seed(_SEED)
    return model(x)


def _output(out):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the model must return a tensor, not {type(out).__name__}")
    return out


@torch.no_grad()
def forward_leak(problem, model, cases):
    """Largest relative change of ``output[source]`` when ``x[forbidden]`` changes, over ``cases``."""
    base = _output(_seeded(model, problem.x))
    scale = float(base.abs().max())
    leak = 0.0
    for source, forbidden in cases:
        moved = _seeded(model, problem.perturbed(problem.x, forbidden))
        leak = max(leak, float((moved[source] - base[source]).abs().max()))
    return leak / scale if scale > 0 else (0.0 if leak == 0 else float("inf"))


def backward_leak(problem, model, cases):
    """Largest relative gradient at ``leaf[forbidden]`` of a random projection of ``output[source]``.

    ``cases`` is a list of ``(source, forbidden, allowed)`` index tuples; returns None when
    no gradient reaches the allowed places at all (the check cannot judge).
    """
    out, leaf = problem.forward_with_leaf(model, problem.x)
    out = _output(out)
    leak = own = 0.0
    for source, forbidden, allowed in cases:
        picked = out[source]
        (grad,) = torch.autograd.grad((picked * torch.randn_like(picked)).sum(), leaf, retain_graph=True,
                                      allow_unused=True)
        if grad is None:
            continue
        leak = max(leak, float(grad[forbidden].abs().max()))
        own = max(own, float(grad[allowed].abs().max()))
    if own == 0.0:
        return None if leak == 0.0 else float("inf")
    return leak / own


def result(name, leak, what, notes, fix):
    """The ``CheckResult`` for a relative ``leak``; ``what`` describes the dependence tested."""
    passed = leak <= LEAK
    message = f"relative leak {leak:.2g}: {what}" if not passed else f"no dependence: {what}"
    if notes:
        message += f" ({'; '.join(notes)})"
    return CheckResult(name, passed, leak, THRESHOLD, message, "" if passed else fix)


def no_gradient(name, problem):
    """The skipped result when no gradient reaches the differentiated tensor."""
    return CheckResult.skip(name, f"no gradient reaches {problem.where_differentiated()} (see nonzero_gradients)")


def no_embedding(name):
    return CheckResult.skip(name, "integer inputs and no nn.Embedding consumes them: nothing to differentiate")


def backward_check(name, problem, cases, leaking, clean, fix):
    """A backward dependence check: the leak of ``cases`` on a copy that does not mix samples.

    ``leaking`` / ``clean``: the result's sentence when it leaks or not, with ``{where}``
    standing for what is differentiated (the input, or the embedding's output).
    """
    if problem.tokens and problem.embedding_name is None:
        return no_embedding(name)
    model, notes = problem.copy(mixing="eval")
    leak = backward_leak(problem, model, cases)
    if leak is None:
        return no_gradient(name, problem)
    where = problem.where_differentiated()
    what = (leaking if leak > LEAK else clean).format(where=where)
    return result(name, leak, what, notes, fix)
