"""Hutchinson's estimator of the Hessian diagonal from Hessian-vector products (any model).

For Rademacher probes ``z_k`` (entries ±1, ``E[z zᵀ] = I``) and the mini-batch Hessian
``H``, ``E[z ⊙ Hz] = diag(H)`` (Bekas et al., 2007) and, restricted to one parameter
tensor ``p``, ``E[z_pᵀ (Hz)_p] = tr H_pp`` (Hutchinson, 1989): both are unbiased. The
estimate is the mean over ``K`` probes; ``Hz = ∇_θ (gᵀz)`` is a double backward pass
through the graph of the gradient the Cockpit takes before the user's backward pass
(``cockpit_lite.curvature.hvp``; the user's backward stays plain), so it works on every
twice-differentiable model (BatchNorm in training mode: the Hessian of the batch loss as
computed; tied weights: the Hessian w.r.t. the shared tensor).

Standard errors: the delete-a-group jackknife of ``cockpit_lite.curvature.jackknife`` over
the probes (``G = min(K, 16)`` groups, ``G − 1`` degrees of freedom).

Probes come from a ``torch.Generator`` seeded by ``(seed, step)``: reproducible, and the
user's random streams are never touched.
"""

import weakref

import torch

from cockpit_lite.curvature import double_backward
from cockpit_lite.curvature.jackknife import GroupedEstimate

_CACHE = weakref.WeakKeyDictionary()
"""HessianVectorProducts → {(probes, seed): DiagonalEstimate}: one estimate per step, shared by quantities."""


class DiagonalEstimate(GroupedEstimate):
    """Hutchinson's diagonal estimate of one step: draws ``z_k ⊙ H z_k`` (``GroupedEstimate``)."""

    method = "hutchinson"

    def __init__(self, products, probes, generator):
        """
        Args:
            products: the step's ``HessianVectorProducts`` (``cockpit_lite.curvature.hvp``).
            probes: the number of probes ``K``.
            generator: the ``torch.Generator`` the probes are drawn from.
        """
        params = products.params
        super().__init__(products.tracked, probes)  # (FSDP2: this rank's rows of the draws are kept)
        chunk = 64  # probes drawn at a time
        for start in range(0, probes, chunk):
            count = min(chunk, probes - start)
            zs = [
                torch.randint(0, 2, (count, *p.shape), generator=generator, device=p.device).to(p.dtype) * 2 - 1
                for p in params
            ]
            # one product per probe, always: vectorising them (is_grads_batched) was 1.3× faster on a
            # small MLP but 1.8× slower on a CNN, impossible where an operation has no batching rule,
            # and choosing by timing made the estimate depend on the machine's load (they round differently)
            rows = [products.hvp([z[k] for z in zs]) for k in range(count)]
            hz = [torch.stack(parts) for parts in zip(*rows)]
            self.add(start, [z * h for z, h in zip(zs, hz)])
        self.finish()


def estimate(products, probes, seed):
    """The step's ``DiagonalEstimate`` (computed once per step and settings, then shared).

    Args:
        products: the step's ``HessianVectorProducts``.
        probes: number of Rademacher probes.
        seed: seed of the probes' generator, combined with the step.

    Raises:
        RuntimeError: if a layer has no second derivative (names the layer and the fix,
            ``cockpit_lite.curvature.double_backward``).
    """
    per_step = _CACHE.setdefault(products, {})
    key = (probes, seed)
    if key not in per_step:
        generator = torch.Generator(device=products.params[0].device).manual_seed(hash((seed, products.step)) % 2**63)
        try:
            per_step[key] = DiagonalEstimate(products, probes, generator)
        except RuntimeError as error:
            explained = double_backward.explain(error, products.model, products.loss)
            if explained is None:
                raise
            raise RuntimeError(f"Hutchinson's estimator at step {products.step}: {explained} ({error})") from error
    return per_step[key]
