"""A few optimisation steps on one fixed batch, shared by ``overfit_one_batch`` and
``input_independent_baseline`` (always on a copy of the model)."""

import math

import torch


def train(model, loss_fn, x, y, optimizer, steps, target=None):
    """Up to ``steps`` updates on ``(x, y)``; returns the losses seen before each update.

    Stops early when the loss is ``<= target`` (that loss is the last entry, no update
    follows) or not finite.
    """
    losses = []
    for _ in range(steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        value = loss.item()
        losses.append(value)
        if not math.isfinite(value) or (target is not None and value <= target) or len(losses) > steps:
            break
        loss.backward()
        optimizer.step()
    return losses


def trainable_params(problem, model):
    """The copy's parameters the optimizer gets (those that require grad)."""
    return [p for _, p in problem.trainable(model) if p.requires_grad]


def looks_like_probabilities(problem, output):
    """True when the output is already a probability distribution over the class axis."""
    if not problem.classification or not torch.is_floating_point(output):
        return False
    sums = output.sum(problem.class_axis)
    return bool((output >= 0).all() and torch.allclose(sums, torch.ones_like(sums), atol=1e-4))
