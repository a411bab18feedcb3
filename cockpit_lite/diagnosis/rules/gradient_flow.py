"""The relative gradients r = ‖g‖/‖θ‖ per weight tensor, in parameter (≈ forward) order, read
between the input end (the first weight tensor) and the output end (``reference``), by
``vanishing_gradients`` and ``shuffled_labels``."""

from cockpit_lite.diagnosis.history import module_of


def layer(history, index):
    return module_of(history.name(index))


def reference(ratios):
    """max r over the last two weight tensors (the output end)."""
    return max(r for _, r in ratios[-2:])
