"""Linear: the weight's individual gradients stay factored as ``(a, δ)``."""

import torch

from cockpit_lite.engine.rules.base import Rule, UnsupportedCall, batch_axis, compute_dtype, output_grad, samples_first
from cockpit_lite.engine.per_sample import PerSample


class LinearRule(Rule):
    """``y = x Wᵀ + b`` on inputs with any leading axes ``[..., I]``.

    Sample n's weight gradient is ``Σ_l δ_{n,l} a_{n,l}ᵀ`` over the non-batch leading axes
    ``l`` (positions of a sequence), kept as the factors ``a = [B, L, I]``,
    ``δ = [B, L, O]``; the bias's is ``Σ_l δ_{n,l}``.
    """

    def check(self, call, batch_size):
        if not call.args or not torch.is_tensor(call.args[0]):
            raise UnsupportedCall("Linear called without a positional input")
        batch_axis(call.args[0], batch_size, exclude_last=True)

    def per_sample(self, call, tracked, batch_size):
        if not call.args or not call.leaves:
            raise UnsupportedCall("Linear called without a positional input")
        inputs, delta = call.args[0], output_grad(call)
        dtype = compute_dtype(inputs, delta, call.module.weight)
        a = samples_first(inputs, batch_size, exclude_last=True, dtype=dtype)
        d = samples_first(delta, batch_size, exclude_last=True, dtype=dtype)
        if a.shape[:-1] != d.shape[:-1]:
            raise UnsupportedCall("Linear input and output gradient disagree on the batch axis")
        a = a.reshape(batch_size, -1, a.shape[-1])
        d = d.reshape(batch_size, -1, d.shape[-1])
        out = {}
        for name, param, index in tracked:
            if name == "weight":
                out[name] = PerSample(param, index, factors=(a, d))
            else:
                out[name] = PerSample(param, index, grad_batch=d.sum(1))
        return out


class TransposedLinearRule(LinearRule):
    """Hugging Face's ``Conv1D`` (GPT-2): ``y = x W + b`` with ``W`` of shape ``[in, out]``.

    The Linear rule with the factors' roles swapped: sample n's weight gradient
    ``Σ_l a_{n,l} δ_{n,l}ᵀ`` is the factored form ``(δ, a)``.
    """

    def per_sample(self, call, tracked, batch_size):
        out = super().per_sample(call, tracked, batch_size)
        if "weight" in out:
            a, d = out["weight"]._factors
            out["weight"]._factors = (d, a)
        return out
