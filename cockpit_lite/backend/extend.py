"""Extending a model for BackPACK (``extend``: refused up front where BackPACK's stored inputs and outputs
would collide with the model's own attributes), keeping BackPACK out of the Cockpit's own passes
(``backpack_untouched``) and the advice added to BackPACK's errors (``add_advice``)."""

import re
from contextlib import contextmanager

import backpack
from backpack.context import CTX
from backpack.custom_module.graph_utils import convert_module_to_backpack
from backpack.utils.module_classification import is_no_op

from cockpit_lite.backend.curvature import UNCALLED_CONTAINERS


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
    cannot handle, and for modules whose own attributes BackPACK's forward hook would
    overwrite, and names them.

    Args:
        module: the model or loss function.
        use_converter: convert the model with BackPACK's converter first (as
            ``backpack.extend(module, use_converter=True)``); needed for second-order
            quantities on models with residual connections.

    Returns:
        The extended module.

    Raises:
        ValueError: if a sub-module computes in place, if a sub-module has a child,
            parameter, buffer or attribute named like BackPACK's stored input and
            output, or if BackPACK's converter cannot trace the model.
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
    if use_converter:
        try:
            module = convert_module_to_backpack(module, False)
        except Exception as error:  # torch.fx tracing fails on data-dependent Python code
            fix = (
                "give the Cockpit the model without extending it, Cockpit(model) (BackPACK cannot "
                f"extend it without the converter either: {_listed(collisions)}); HessTrace then "
                "estimates from Hessian-vector products, and TICDiag and TICTrace take the engine's "
                "exact GGN diagonal"
            ) if (collisions := _io_collisions(module)) else (
                "cockpit_lite.extend(model) without the converter; the curvature quantities then "
                "estimate from Hessian-vector products (curvature='auto' or 'hutchinson'), which "
                "need no conversion"
            )
            raise ValueError(
                f"BackPACK's converter cannot trace {type(module).__name__} ({type(error).__name__}: "
                f"{error}). Fix: {fix}."
            ) from error
    collisions = _io_collisions(module)
    if collisions:
        raise ValueError(
            f"BackPACK cannot extend {type(module).__name__}: it stores every extended module's "
            "input and output as the attributes 'input0', 'input1', ... and 'output', which these "
            "modules use for a child module, parameter, buffer or attribute of their own: "
            f"{_listed(collisions)}. Fix: give the Cockpit the model without extending it, "
            "Cockpit(model): the first-order quantities are exact, HessTrace takes Hutchinson's "
            "estimator (Hessian-vector products) instead of BackPACK's Hessian diagonal, and "
            "TICDiag and TICTrace the engine's exact GGN diagonal (curvature='diag_ggn_exact' "
            "gives HessTrace that one as well)."
        )
    return backpack.extend(module)


_STORED_IO = re.compile(r"output|input\d+")
"""The attributes BackPACK's forward hook sets on every extended module (``module.output``,
``module.input0``, ...) and its backward hook deletes."""


def _io_collisions(model):
    """The modules of ``model`` whose own children, parameters, buffers or attributes BackPACK's
    stored input and output would overwrite (or, at its clean-up, delete), one phrase each.

    BackPACK stores each extended module's input and output as the attributes ``input0``,
    ``input1``, ... and ``output``; on a module with a child of that name (Hugging Face's
    ``BertAttention`` and ``BertLayer`` have a child ``output``) the assignment raises a
    ``TypeError`` inside the forward pass, on a buffer or plain attribute it replaces it.
    Containers BackPACK does not hook, or that are never called, are left out.
    """
    collisions = []
    for name, module in model.named_modules():
        if is_no_op(module) or type(module) in UNCALLED_CONTAINERS:
            continue
        names = set(module._modules) | set(module._parameters) | set(module._buffers) | set(dir(type(module)))
        if not getattr(module, "_backpack_extend", False):  # (once extended, BackPACK's own are there)
            names |= set(vars(module))
        found = sorted(n for n in names if _STORED_IO.fullmatch(n))
        if found:
            where = repr(name) if name else "the model"
            collisions.append(f"{where} ({type(module).__name__}) has {' and '.join(map(repr, found))}")
    return collisions


def _listed(collisions):
    return "; ".join(collisions[:3]) + (f"; and {len(collisions) - 3} more" if len(collisions) > 3 else "")


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
