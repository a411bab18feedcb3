"""Shared by ``exploding_gradients`` and ``vanishing_gradients``: per weight tensor the
relative gradient r = ‖g‖/‖θ‖, in parameter (≈ forward) order."""

from cockpit_lite.diagnosis.history import module_of


def layer(history, index):
    return module_of(history.name(index))


def reference(ratios):
    """max r over the last two weight tensors (the output end)."""
    return max(r for _, r in ratios[-2:])
