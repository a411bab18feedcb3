"""Hutchinson's estimator of the Hessian diagonal from Hessian-vector products (any model).

For Rademacher probes ``z_k`` (entries ±1, ``E[z zᵀ] = I``) and the mini-batch Hessian
``H``, ``E[z ⊙ Hz] = diag(H)`` (Bekas et al., 2007) and, restricted to one parameter
tensor ``p``, ``E[z_pᵀ (Hz)_p] = tr H_pp`` (Hutchinson, 1989): both are unbiased. The
estimate is the mean over ``K`` probes; ``Hz = ∇_θ (gᵀz)`` is a double backward pass
through the graph of the gradient the Cockpit takes before the user's backward pass
(``cockpit_lite.curvature.hvp``; the user's backward stays plain), so it works on every
twice-differentiable model (BatchNorm in training mode: the Hessian of the batch loss as
computed; tied weights: the Hessian w.r.t. the shared tensor).

Standard errors come from a delete-a-group jackknife over ``G = min(K, 16)`` groups of
probes: ``SE² = (G−1)/G Σ_j (θ_(−j) − θ̄)²`` with ``θ_(−j)`` the statistic of the probes
outside group ``j``. For a linear statistic (a trace) and ``G = K`` it equals the usual
``std_k / √K``; for a nonlinear statistic it is the jackknife's first-order error.

Probes come from a ``torch.Generator`` seeded by ``(seed, step)``: reproducible, and the
user's random streams are never touched.
"""

import weakref

import torch

from cockpit_lite.curvature import double_backward

MAX_GROUPS = 16
"""Probe groups kept for the jackknife (memory: ``MAX_GROUPS`` × the parameters)."""

_CACHE = weakref.WeakKeyDictionary()
"""HessianVectorProducts → {(probes, seed): DiagonalEstimate}: one estimate per step, shared by quantities."""


class DiagonalEstimate:
    """Hutchinson's diagonal estimate of one step, with per-group sums for the jackknife.

    Attributes:
        probes: the number of probe vectors ``K``.
        diagonal: per parameter, ``mean_k z_k ⊙ H z_k``.
        group_sums: per parameter, ``[G, *shape]`` sums of ``z ⊙ Hz`` over each group.
        group_sizes: ``[G]`` probe counts of the groups.
    """

    method = "hutchinson"

    def __init__(self, products, probes, generator):
        """
        Args:
            products: the step's ``HessianVectorProducts`` (``cockpit_lite.curvature.hvp``).
            probes: the number of probes ``K``.
            generator: the ``torch.Generator`` the probes are drawn from.
        """
        params = products.params
        groups = min(probes, MAX_GROUPS)
        self.probes = probes
        self.group_sizes = torch.tensor([len(range(j, probes, groups)) for j in range(groups)])
        sums = [torch.zeros((groups, *p.shape), dtype=p.dtype, device=p.device) for p in params]
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
            group = torch.arange(start, start + count, device=params[0].device) % groups
            for total, z, h in zip(sums, zs, hz):
                total.index_add_(0, group, z * h)
        self.group_sums = sums
        self.diagonal = [s.sum(0) / probes for s in sums]

    def leave_group_out(self):
        """Per parameter, ``[G, *shape]`` diagonal estimates without each group's probes."""
        rest = (self.probes - self.group_sizes).clamp(min=1)
        return [
            (s.sum(0, keepdim=True) - s) / rest.to(s).reshape(-1, *([1] * (s.dim() - 1)))
            for s in self.group_sums
        ]

    def standard_error(self, statistic):
        """Jackknife standard error of ``statistic(diagonal) -> tensor`` (any shape).

        Args:
            statistic: maps a per-parameter list of diagonals to a tensor.

        Returns:
            A tensor shaped like ``statistic``'s value (NaN with a single probe).
        """
        groups = self.group_sizes.numel()
        if groups < 2:
            return torch.full_like(statistic(self.diagonal), float("nan"))
        loo = self.leave_group_out()
        values = torch.stack([statistic([d[j] for d in loo]) for j in range(groups)])
        return ((groups - 1) / groups * ((values - values.mean(0)) ** 2).sum(0)).sqrt()


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
