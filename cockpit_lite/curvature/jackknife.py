"""Diagonal estimates from independent random draws, with delete-a-group jackknife standard errors.

An estimate of a diagonal ``D`` is the mean of ``K`` independent unbiased draws ``d_k`` (one per
random vector: a Rademacher probe of Hutchinson's estimator, a sampled label of the Monte-Carlo
generalised Gauss-Newton matrix). The draws are summed in ``G = min(K, MAX_GROUPS)`` groups
(draw ``k`` in group ``k mod G``), and the standard error of any statistic ``S(D)`` (a trace, a
ratio) is the delete-a-group jackknife's,

    SE² = (G − 1)/G · Σ_j (S_(−j) − S̄)²,   S_(−j) = S(the mean of the draws outside group j),

with ``G − 1`` degrees of freedom. For a linear statistic and ``G = K`` it equals the usual
``std_k / √K``; for a nonlinear one it is the jackknife's first-order error.

For a parameter sharded by FSDP2 (a ``DTensor``) each rank keeps its rows of the group sums only
(``G / W`` times the parameter's size), and the diagonal and the leave-a-group-out diagonals a
statistic sees are ``DTensor``s sharded as the parameter (its sums over elements add the ranks').
"""

import torch

from cockpit_lite.utils.shards import rows_like, shaped_like

MAX_GROUPS = 16
"""Groups of draws kept for the jackknife (memory: ``MAX_GROUPS`` × the parameters)."""


class GroupedEstimate:
    """The mean of ``K`` draws of a per-parameter diagonal, kept as group sums (see the module docstring).

    Attributes:
        probes: the number of draws ``K``.
        diagonal: per parameter, the mean of the draws.
        group_sums: per parameter, ``[G, *shape]`` sums of the draws of each group.
        group_sizes: ``[G]`` draws per group.
    """

    def __init__(self, shapes_like, probes):
        """
        Args:
            shapes_like: per parameter, a tensor of its shape, dtype, device (and sharding).
            probes: the number of draws ``K`` that ``add`` will receive.
        """
        groups = min(probes, MAX_GROUPS)
        self.probes = probes
        self.group_sizes = torch.tensor([len(range(j, probes, groups)) for j in range(groups)])
        self._like = list(shapes_like)
        self.group_sums = [torch.zeros((groups, *rows_like(p, p).shape), dtype=p.dtype, device=p.device)
                           for p in self._like]  # (this rank's rows of a sharded parameter's)
        self.diagonal = None

    @property
    def degrees_of_freedom(self):
        """``G − 1``, those of the jackknife's standard error."""
        return self.group_sizes.numel() - 1

    def add(self, first, draws):
        """Add draws ``first, first + 1, ...``: per parameter a ``[count, *shape]`` tensor (whole, or a
        ``DTensor`` sharded as the parameter)."""
        count = draws[0].shape[0]
        groups = self.group_sizes.numel()
        group = torch.arange(first, first + count, device=draws[0].device) % groups
        for total, values, like in zip(self.group_sums, draws, self._like):
            total.index_add_(0, group, rows_like(values, like, dim=1).to(total.dtype))

    def finish(self):
        """Form ``diagonal`` once every draw was added."""
        self.diagonal = [shaped_like(s.sum(0) / self.probes, like) for s, like in zip(self.group_sums, self._like)]
        return self

    def leave_group_out(self):
        """Per parameter, ``[G, *shape]`` diagonal estimates without each group's draws (this rank's rows)."""
        rest = (self.probes - self.group_sizes).clamp(min=1)
        return [
            (s.sum(0, keepdim=True) - s) / rest.to(s).reshape(-1, *([1] * (s.dim() - 1)))
            for s in self.group_sums
        ]

    def standard_error(self, statistic):
        """Jackknife standard error of ``statistic(diagonal) -> tensor`` (any shape).

        Returns:
            A tensor shaped like ``statistic``'s value (NaN with a single draw).
        """
        groups = self.group_sizes.numel()
        if groups < 2:
            return torch.full_like(statistic(self.diagonal), float("nan"))
        loo = self.leave_group_out()
        values = torch.stack([statistic([shaped_like(d[j], like) for d, like in zip(loo, self._like)])
                              for j in range(groups)])
        return ((groups - 1) / groups * ((values - values.mean(0)) ** 2).sum(0)).sqrt()
