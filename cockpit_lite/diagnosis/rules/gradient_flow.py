"""The relative gradients r = ‖g‖/‖θ‖ per weight tensor, in parameter (≈ forward) order, read
between the input end (the first weight tensor) and the output end (``reference``), by
``vanishing_gradients`` and ``shuffled_labels``."""

from cockpit_lite.diagnosis.history import module_of


def layer(history, index):
    return module_of(history.name(index))


def reference(ratios):
    """The output end's r: the smaller of the last two weight tensors' (of two in all, the last's).
    Gradients that vanish through the depth leave both far above the input end's; one odd tensor
    there does not make the whole network look vanishing (a zero-initialised head, as MLP-Mixer's,
    once past ``TINY_WEIGHT``: r = 11 – 41 while the layer before it had 1e-4, as had the input end)."""
    return min(r for _, r in ratios[max(1, len(ratios) - 2):])
