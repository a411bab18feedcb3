"""The check of the engine's individual gradients: their sum against the gradient autograd accumulated."""

import math

import torch

from cockpit_lite.info import PENALTY_FIX
from cockpit_lite.utils.grads import held
from cockpit_lite.utils.shards import local

GRAD_CHECK_RTOL = {torch.float64: 1e-6, torch.float32: 1e-3}
"""Largest relative difference between the rules' gradient and autograd's before a
parameter is declared served wrongly (low-precision dtypes: ``LOW_PRECISION_RTOL``)."""
LOW_PRECISION_RTOL = 5e-2
NOISE_FACTOR = 10
"""A gradient below the check's floor on which the rules and autograd disagree by more than this many
times the check's tolerance, relative to its own norm, is rounding noise (``Engine.noise``)."""
MODEL_SCALE_FRACTION = 1e-3
"""The check's floor: this fraction of the model's gradient norm, scaled to a parameter's
size, stands in for a parameter's own norm when that is smaller (``check_gradients``)."""


def check_gradients(state, params, fail):
    """Check each rule-served parameter's ``Σ_n grad_batch[n]`` against autograd's gradient (at a
    subsampled step, ``PerSample.check``'s estimate of their difference where it has one).

    The tolerance is relative to the larger of the parameter's own gradient norm and
    ``MODEL_SCALE_FRACTION`` of the model's gradient norm scaled to the parameter's
    size (``‖g_model‖ · sqrt(numel / model numel)``): a gradient that is zero in exact
    arithmetic (attention key biases, which softmax ignores) is rounding noise in both,
    and two noises must not fail the check against each other.
    """
    checked = []
    served = [(index, (grad, None)) for index, grad in state.served.items()] + list(state.checks.items())
    for index, (engine, project) in served:
        if engine is None or index in state.failed:
            continue
        param = params[index]
        if state.true_grads is not None:  # a pseudo-loss's pass (``pseudo_pass``): autograd's of it
            true = state.true_grads.get(index)
        elif param.grad is None:
            continue
        else:
            true = local(held(param))  # (FSDP2: this rank's rows, as ``engine``)
            if state.grads_before[index] is not None:
                true = true - local(state.grads_before[index])
        if true is None:
            continue
        true = true.to(engine.dtype)
        compared = true.reshape(-1) if project is None else project(true)
        if engine.shape != compared.shape:  # a rule's output of another form: not this parameter's gradient
            fail(state, index, f"the individual gradients sum to a tensor of shape {tuple(engine.shape)}, "
                               f"autograd's gradient to {tuple(compared.shape)}")
            continue
        checked.append((index, param, engine, true, compared))
    if not checked:
        return
    # every parameter's norms in two fused operations (one host transfer each)
    norms = torch._foreach_norm([true for _, _, _, true, _ in checked])
    errors = torch._foreach_norm(torch._foreach_sub([e for _, _, e, _, _ in checked], [c for *_, c in checked]))
    values = list(norms) + list(errors)
    if len({(v.dtype, v.device) for v in values}) == 1:  # (one transfer for all)
        values = torch.stack(values).tolist()
    norms, errors = [float(v) for v in values[: len(checked)]], [float(v) for v in values[len(checked) :]]
    if state.sharded is not None:
        norms, errors = state.sharded.check_norms(norms, errors)
    size = sum(param.numel() for _, param, _, _, _ in checked)
    model = sum(n * n for n in norms if math.isfinite(n)) ** 0.5
    for (index, param, engine, true, compared), norm, error in zip(checked, norms, errors):
        low = param.dtype not in GRAD_CHECK_RTOL or engine.dtype not in GRAD_CHECK_RTOL or state.low_precision
        rtol = LOW_PRECISION_RTOL if low else GRAD_CHECK_RTOL[param.dtype]
        scale = max(norm, MODEL_SCALE_FRACTION * model * (param.numel() / size) ** 0.5)
        disagreement = error
        resummed = state.resummed.get(index)  # (the global path's: its VJPs' sum against their total's)
        if resummed is not None and norm < scale:
            disagreement = max(error, float((resummed.to(engine.dtype) - engine).norm()))
        if norm < scale and disagreement > NOISE_FACTOR * rtol * norm:  # zero up to rounding: noises disagree
            state.noise.add(index)
        if error > rtol * scale + 1e-30 and torch.isfinite(true).all():
            away = f"{error / max(norm, 1e-30):.2g} (relative) away from autograd's"
            if state.repeated:  # not a use the engine missed, nor (only) another loss
                fail(state, index, (
                    f"the individual gradients sum to a gradient {away}: backward ran more than once "
                    "inside cp(step), and they are those of one backward pass. Fix: call "
                    "backward once, on the sum of the losses ((loss_a + loss_b).backward()), and pass "
                    "that sum as info['loss'] (micro-batches: Cockpit(model, accumulate=True) and one "
                    "`with cp(step)` around each backward)"
                ), demote=False)
                continue
            if state.penalty is not None and not state.of_info_loss(index):
                reason = f"the individual gradients sum to a gradient {away}: {state.penalty}"
            elif state.of_info_loss(index):
                reason = (
                    f"the gradient of info['loss'] is {away} in this backward pass: backward ran on "
                    "another loss (e.g. info['loss'] plus a penalty on the parameters, such as an "
                    "explicit L2 term). Fix: call backward on info['loss'] inside the context; for "
                    f"a penalty, {PENALTY_FIX}"
                )
            else:
                reason = (
                    f"the individual gradients sum to a gradient {away}: the parameter is used "
                    "somewhere the engine did not see (e.g. read by a parent module's own code as "
                    "well), or backward ran on another loss than info['loss'] (e.g. info['loss'] "
                    f"plus a penalty on the parameters, such as an explicit L2 term: {PENALTY_FIX})"
                )
            fail(state, index, reason)
