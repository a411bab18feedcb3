"""``causal_forward`` and ``causal_backward``: a sequence model does not see the future.

For ``(B, T, ...)`` inputs with the sequence axis ``sequence_dim`` (1 by default
for ``task="causal_lm"``), the output at position t must not depend on inputs at
positions after t: changing the inputs from position t0 on leaves the outputs
before t0 unchanged (forward), and the gradient of the outputs before t0 with
respect to the inputs from t0 on is zero (backward; for tokens, at the output of
the input embedding). Probed at t0 = 1, T/2 and T−1, so an attention mask that
lets position t see t+1 is caught as well as a missing mask or a bidirectional
RNN. Skipped for models without a sequence axis in the output.
Threshold: relative leak ``<= 1e-5`` (``dependence.LEAK``).
"""

import torch

from . import dependence
from .report import CheckResult

FIX = ("the output at position t depends on later positions: pass a causal attention mask "
       "(e.g. nn.Transformer.generate_square_subsequent_mask(T), is_causal=True), "
       "use a unidirectional RNN, pad convolutions on the left only")


def _applies(problem, name):
    """None if the causal checks apply, else the skipped result saying why."""
    sd = problem.sequence_dim
    if sd is None:
        return CheckResult.skip(name, "not a sequence model (sequence_dim=None, task is not causal_lm)")
    if problem.x.dim() <= sd or problem.x.shape[sd] < 2:
        return CheckResult.undecided(name, f"the inputs have no sequence axis {sd} of length >= 2: no later position "
                                     "to leak from", "pass sequences of at least 2 positions")
    model, _ = problem.copy()
    with torch.no_grad():
        out = model(problem.x)
    if out.dim() <= sd or out.shape[sd] != problem.x.shape[sd]:
        return CheckResult.skip(
            name, f"the output {tuple(out.shape)} has no sequence axis {sd} of length T={problem.x.shape[sd]} "
                  "(a sequence classifier is not causal by design)")
    return None


def _cuts(problem):
    length = problem.x.shape[problem.sequence_dim]
    return sorted({1, length // 2, length - 1})


def _positions(problem, start, stop):
    return (slice(None),) * problem.sequence_dim + (slice(start, stop),)


def forward(problem):
    """Changing the inputs from position t0 on leaves the outputs before t0 unchanged."""
    name = "causal_forward"
    skipped = _applies(problem, name)
    if skipped is not None:
        return skipped
    model, notes = problem.copy(mixing="eval")
    cases = [(_positions(problem, 0, t), _positions(problem, t, None)) for t in _cuts(problem)]
    leak = dependence.forward_leak(problem, model, cases)
    what = ("changing later positions moves earlier outputs" if leak > dependence.LEAK
            else "changing later positions leaves earlier outputs unchanged")
    return dependence.result(name, leak, what, notes, FIX)


def backward(problem):
    """The gradient of the outputs before t0 with respect to the inputs from t0 on is zero."""
    name = "causal_backward"
    skipped = _applies(problem, name)
    if skipped is not None:
        return skipped
    cases = [(_positions(problem, 0, t), _positions(problem, t, None), _positions(problem, 0, t))
             for t in _cuts(problem)]
    return dependence.backward_check(
        name, problem, cases,
        "earlier outputs have a gradient w.r.t. later positions of {where}",
        "gradients of earlier outputs w.r.t. later positions of {where} are zero",
        FIX,
    )
