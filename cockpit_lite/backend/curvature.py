"""Which BackPACK extension gives a curvature quantity its buffers, and whether BackPACK serves a model
(``curvature_support``): the model's modules and the loss's kind checked before a step needs them."""


import torch
from backpack.extensions import DiagGGNExact, DiagGGNMC, DiagHessian
from backpack.utils.module_classification import is_no_op
from torch.nn.modules.batchnorm import _BatchNorm


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


_LOSS_NODES = {
    # autograd node under an extended loss module's hook -> the BackPACK loss module it comes from
    "MseLossBackward0": "MSELoss",
    "BinaryCrossEntropyWithLogitsBackward0": "BCEWithLogitsLoss",
}


def _loss_class(loss):
    """Name of the BackPACK-extended loss module that computed ``loss``, or ``None``.

    An extended module's output passes through a ``BackwardHookFunctionBackward`` node.
    Cross-entropy is ``NllLoss`` right after ``LogSoftmax`` (a bare ``NLLLoss`` is not
    supported by BackPACK's second-order extensions); BCE-with-logits only with one
    logit per sample.
    """
    node = getattr(loss, "grad_fn", None)
    if node is None or type(node).__name__ != "BackwardHookFunctionBackward":
        return None
    node = node.next_functions[0][0]
    name = type(node).__name__
    if name == "NllLossBackward0":
        inner = node.next_functions[0][0]
        return "CrossEntropyLoss" if type(inner).__name__ == "LogSoftmaxBackward0" else None
    if name == "BinaryCrossEntropyWithLogitsBackward0":
        logits = node._saved_self
        if logits.dim() > 1 and logits.shape[-1] != 1:
            return None  # multi-logit BCE: BackPACK's extension is binary only
    return _LOSS_NODES.get(name)


def curvature_support(model, loss, name):
    """Whether BackPACK can compute the diagonal curvature ``name`` exactly for this step.

    Decided before the backward pass, from the model's modules and the loss's autograd
    graph, so that an unsupported model never reaches BackPACK's hooks (whose failure
    inside ``loss.backward()`` would stop the user's training). Supported: every module
    extended (``cockpit_lite.extend``) and of a class the extension has a rule for
    (containers: ``nn.Sequential`` and the converter's graph modules), no BatchNorm in
    training mode, and a loss computed by an extended ``CrossEntropyLoss``, ``MSELoss``
    or single-logit ``BCEWithLogitsLoss``.

    Args:
        model: the ``torch.nn.Module`` given to the Cockpit, or ``None``.
        loss: the mini-batch loss tensor (``info["loss"]``), or ``None``.
        name: a key of ``CURVATURES``.

    Returns:
        ``None`` if supported, else a sentence saying why not (naming the layer).
    """
    if model is None:
        return (
            "cockpit-lite found no module owning the tracked parameters in this step's "
            "forward pass, so it cannot check which layers BackPACK supports"
        )
    rules = CURVATURES[name]()._BackpropExtension__module_extensions
    for module_name, module in model.named_modules():
        label = f"{'the layer ' + module_name if module_name else 'the model'} ({type(module).__name__})"
        if is_no_op(module) or type(module) in UNCALLED_CONTAINERS:
            continue
        if not getattr(module, "_backpack_extend", False):
            return f"{label} is not BackPACK-extended"
        if type(module) not in rules:
            return f"BackPACK's {CURVATURES[name].__name__} has no rule for {label}"
        if isinstance(module, _BatchNorm) and module.training:
            return f"{label} is a BatchNorm in training mode (it mixes the samples)"
    loss_class = _loss_class(loss)
    if loss_class is None:
        node = type(getattr(loss, "grad_fn", None)).__name__
        return (
            "the loss was not computed by an extended CrossEntropyLoss, MSELoss or "
            f"single-logit BCEWithLogitsLoss module (its autograd node is {node})"
        )
    return None


UNCALLED_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Module)
"""Containers without a forward of their own (BackPACK never sees them called); a bare
``nn.Module`` is how BackPACK's converter keeps the hierarchy of a traced custom module."""


def backpack_extended(model, loss):
    """Whether the user meant BackPACK to run: some module of ``model`` or the module that
    computed ``loss`` is BackPACK-extended."""
    node = getattr(loss, "grad_fn", None)
    if node is not None and type(node).__name__ == "BackwardHookFunctionBackward":
        return True
    return model is not None and any(getattr(m, "_backpack_extend", False) for m in model.modules())


def unsupported_message(quantity, name, reason):
    """The refusal of an explicitly chosen BackPACK curvature, with fixes that work."""
    return (
        f"{quantity} cannot use curvature={name!r} on this model: {reason}. Fix: "
        f"{quantity}(curvature='hutchinson') (or configuration(level, curvature='auto'), "
        "the default) estimates the Hessian's diagonal from Hessian-vector products on any "
        "model, and curvature='diag_ggn_exact' gives the exact GGN diagonal on any model "
        "with a cross-entropy, MSE, BCE-with-logits, Huber or smooth-L1 loss; for BackPACK's "
        "exact Hessian diagonal wrap the model and the loss module in cockpit_lite.extend(...) "
        "and use only layers BackPACK supports."
    )
