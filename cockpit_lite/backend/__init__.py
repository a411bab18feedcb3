"""BackPACK glue: extending models, curvature buffers, error advice.

Nothing outside ``cockpit_lite.cockpit`` and ``cockpit_lite.quantities`` imports this
package; ``instruments`` never does.
"""

from contextlib import contextmanager

import backpack
from backpack.context import CTX
from backpack.extensions import DiagGGNExact, DiagGGNMC, DiagHessian

__all__ = [
    "CURVATURES",
    "add_advice",
    "backpack_untouched",
    "extend",
    "uses_random_numbers",
]

RANDOM_EXTENSIONS = (DiagGGNMC,)
"""BackPACK extensions that draw random numbers (Monte-Carlo sampling)."""


def uses_random_numbers(extension):
    """Whether a BackPACK extension draws from the global random number generators."""
    return isinstance(extension, RANDOM_EXTENSIONS)


CURVATURES = {
    "diag_h": DiagHessian,
    "diag_ggn_exact": DiagGGNExact,
    "diag_ggn_mc": DiagGGNMC,
}
"""Name of a diagonal curvature (also the BackPACK savefield) → BackPACK extension class."""


def curvature_extension(name, quantity):
    """Return a new BackPACK extension computing the diagonal curvature ``name``.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in CURVATURES:
        raise ValueError(
            f"{quantity}: unknown curvature {name!r}; choose one of {sorted(CURVATURES)}"
        )
    return CURVATURES[name]()


@contextmanager
def backpack_untouched():
    """Run autograd work of cockpit-lite's own (VJPs, re-run layers) past BackPACK's hooks.

    On an extended model, BackPACK's backward hooks would delete the inputs and outputs
    it stored in the forward pass (which its curvature extensions still need in the
    user's backward pass), and its forward hooks would store new ones.
    """
    retain = CTX.get_retain_graph()
    CTX.set_retain_graph(True)
    try:
        with backpack.disable():
            yield
    finally:
        CTX.set_retain_graph(retain)


def extend(module, use_converter=False):
    """Make ``module`` (a model or a loss module) ready for cockpit-lite, as ``backpack.extend``.

    Checks first for in-place activations (``inplace=True``), which BackPACK's hooks
    cannot handle, and names them.

    Args:
        module: the model or loss function.
        use_converter: passed to ``backpack.extend``; needed for second-order
            quantities on models with residual connections.

    Returns:
        The extended module.

    Raises:
        ValueError: if a sub-module computes in place.
    """
    in_place = [
        f"{name or type(module).__name__} ({sub})"
        for name, sub in module.named_modules()
        if getattr(sub, "inplace", False) is True
    ]
    if in_place:
        raise ValueError(
            "BackPACK cannot run on modules that overwrite their input in place: "
            + ", ".join(in_place)
            + ". Fix: construct them with inplace=False (e.g. torch.nn.ReLU()); this "
            "affects every cockpit-lite quantity that uses BackPACK."
        )
    return backpack.extend(module, use_converter=use_converter)


_ADVICE = (
    (
        AssertionError,
        "expects a backpropagation quantity",
        "The quantities {quantities} use BackPACK's second-order extensions, which need "
        "the loss function to be an extended module: lossfunc = "
        "cockpit_lite.extend(torch.nn.CrossEntropyLoss()). Functional losses such as "
        "F.cross_entropy cannot be used for them.",
    ),
    (
        AttributeError,
        "has no attribute '",
        "BackPACK lost a layer's stored input or output: a module was called more "
        "than once in one forward pass (shared weights), or the model was run again "
        "(or extended) between the forward pass and backward. The quantities "
        "{quantities} need BackPACK: use a separate module per call, leave shared "
        "parameters out of the Cockpit, and call backward right after the forward pass.",
    ),
    (
        NotImplementedError,
        "does not have an extension for Module",
        "BackPACK has no rule for this layer in an extension that {quantities} need. "
        "For curvature quantities try curvature='diag_ggn_exact' (and "
        "cockpit_lite.extend(model, use_converter=True) for residual networks), or "
        "leave these quantities out.",
    ),
)


def add_advice(error, quantities):
    """Attach a note with the likely cause and fix to a BackPACK ``error`` raised in backprop.

    Args:
        error: the exception raised during ``loss.backward()``.
        quantities: names of the quantities that were due.
    """
    text = str(error)
    for error_type, marker, advice in _ADVICE:
        if isinstance(error, error_type) and marker in text:
            note = "cockpit-lite: " + advice.format(quantities=", ".join(quantities))
            if hasattr(error, "add_note"):  # Python >= 3.11
                error.add_note(note)
            else:
                error.args = (f"{text}\n{note}",)
            return
