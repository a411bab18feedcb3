"""A gradient-clipping value from observed gradient norms.

``suggest_clip_value`` computes the total gradient norm ‖g‖ (over all parameters,
as ``torch.nn.utils.clip_grad_norm_`` measures it) on each of up to
``max_batches`` batches, on a copy of the model at its current parameters (no
update), and suggests their ``percentile``-th percentile (default 90).

Rule and reason: clipping at the 90th percentile leaves nine in ten ordinary
steps untouched (clipping them would only act as a smaller learning rate) and
caps the rare large gradients, the spikes that clipping exists for, at the size
of a large ordinary step. Measure again after some training: norms at
initialisation are often larger than later ones.
"""

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from .isolation import batch_list, forked_rng, model_copy


@dataclass
class ClipSuggestion:
    """``value`` (for ``clip_grad_norm_(params, value)``), the observed ``norms`` and the rule."""

    value: float
    norms: list
    percentile: float

    @property
    def rule(self):
        return f"{self.percentile:g}th percentile of {len(self.norms)} observed total gradient norms"

    def __float__(self):
        return float(self.value)

    def __str__(self):
        return f"clip gradients at {self.value:.3g} ({self.rule}; median {np.median(self.norms):.3g})"


def suggest_clip_value(model, loss_fn, batches, percentile=90.0, max_batches=20, seed=0):
    """Suggest ``max_norm`` for ``torch.nn.utils.clip_grad_norm_`` from observed gradient norms.

    Args:
        model: the model (never changed).
        loss_fn: ``loss_fn(model(x), y)`` -> scalar.
        batches: ``(x, y)`` pairs (a list or a loader) or one pair; one norm per batch.
        percentile: which percentile of the norms to suggest.
        max_batches: at most this many batches are used.
    """
    twin = model_copy(model)
    params = [p for p in twin.parameters() if p.requires_grad]
    selected = list(itertools.islice(iter(batch_list(batches)), max_batches))
    if not selected:
        raise ValueError("batches is empty")
    norms = []
    with forked_rng(selected[0][0], seed), torch.enable_grad():
        for x, y in selected:
            grads = torch.autograd.grad(loss_fn(twin(x), y), params, allow_unused=True)
            norms.append(float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(g) for g in grads if g is not None]))))
    return ClipSuggestion(float(np.percentile(norms, percentile)), norms, percentile)
