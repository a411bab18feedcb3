"""Which layer has no second derivative, when a Hessian-vector product fails.

A Hessian-vector product ``Hv = ∇(gᵀv)`` differentiates the backward pass. PyTorch has
no derivative for the backward of a few operators (torch 2.13: ``hardsigmoid``, so
``nn.Hardsigmoid`` and ``F.hardsigmoid``, e.g. in MobileNetV3's squeeze-excitation; the
flash-attention kernels, see ``cockpit_lite.curvature.sdpa``), and the double backward
fails with ``derivative for aten::OP_backward is not implemented``, naming neither the
layer nor a fix. ``explain(error, model, loss)`` finds the layer without a list of
layers:

1. the forward operator ``OP``: its autograd node in the loss's graph is
   ``CamelCase(OP)Backward0`` (``HardsigmoidBackward0``), whose saved input tensors
   give the shapes the operator saw at this step;
2. every leaf module of the model is run as a copy (no hooks, parameters detached,
   buffers cloned) in the module's own mode on a random input of each such shape, and
   differentiated twice; a module whose double backward fails on the same operator is
   the layer.

The search runs under a forked random state (CPU, and every GPU the model or the
graph's tensors are on), seeded with 0: its inputs, and what leaves draw (Dropout in
training mode), come from there, so the user's random streams, the model's
parameters, buffers and modes are as they were, and the search is reproducible.
"""

import contextlib
import copy
import re
from collections import OrderedDict

import torch

_MISSING = re.compile(r"derivative for aten::(\w+) is not implemented")

FIXES = {
    "hardsigmoid": (
        "replace it by a module computing torch.nn.functional.relu6(x + 3) / 6 (the same "
        "function, which PyTorch differentiates twice; its second derivative is zero, as "
        "hardsigmoid's); nn.Hardswish, SiLU and Sigmoid have second derivatives as they are"
    ),
}
"""Forward operator → a replacement that PyTorch differentiates twice."""

GENERIC_FIX = (
    "replace it by layers whose backward PyTorch can differentiate, or leave HessMaxEV and "
    "curvature='hutchinson' out; HessTrace with BackPACK's exact diagonals "
    "(curvature='diag_h' or 'diag_ggn_exact' on a model wrapped in cockpit_lite.extend) "
    "needs no double backward where BackPACK has a rule for every layer"
)


def missing_operator(error):
    """The backward operator named by a missing-derivative ``error`` (``None`` for another error)."""
    match = _MISSING.search(str(error))
    return match.group(1) if match else None


def explain(error, model, loss):
    """A sentence naming the layer whose operator has no double backward, and the fix.

    Args:
        error: the ``RuntimeError`` of the double backward.
        model: the step's model (``StepInfo.model``), or ``None``.
        loss: the step's loss tensor, or ``None``.

    Returns:
        The sentence, or ``None`` when ``error`` is not a missing derivative.
    """
    backward = missing_operator(error)
    if backward is None:
        return None
    forward = backward[: -len("_backward")] if backward.endswith("_backward") else backward
    shapes = _input_shapes(loss, forward)
    layers = _layers(model, shapes, backward) if model is not None else []
    fix = FIXES.get(forward, GENERIC_FIX)
    if layers:
        where = ("the layer " if len(layers) == 1 else "the layers ") + ", ".join(layers)
    elif model is None:
        where = f"an operation of the forward pass (aten::{forward})"
    else:
        where = (
            f"an operation of the forward pass (aten::{forward}) that no leaf module runs on "
            "its own, so a function call inside a module's forward"
        )
    return (
        f"{where} has no second derivative in PyTorch (the derivative of aten::{backward} "
        f"is not implemented), so Hessian-vector products fail. Fix: {fix}"
    )


def _node_name(forward):
    return "".join(part.capitalize() for part in forward.split("_") if part) + "Backward"


def _input_shapes(loss, forward):
    """Shapes (with dtype) of the floating tensors saved by ``forward``'s nodes in ``loss``'s graph."""
    prefix, shapes, seen = _node_name(forward), [], set()
    stack = [getattr(loss, "grad_fn", None)]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.rstrip("0123456789") == prefix:
            for attribute in dir(node):
                value = getattr(node, attribute, None) if attribute.startswith("_saved_") else None
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    key = (tuple(value.shape), value.dtype, value.device)
                    if key not in shapes:
                        shapes.append(key)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return shapes


def _layers(model, shapes, backward):
    """``"name (Class)"`` of the leaf modules whose double backward fails on ``backward``."""
    marker = f"aten::{backward} "
    found = []
    with _forked_random_state(model, shapes):
        for name, module in model.named_modules():
            if next(module.children(), None) is not None:
                continue
            for shape, dtype, device in shapes:
                if marker in _double_backward_error(module, shape, dtype, device):
                    found.append(f"{name or 'the model'} ({type(module).__name__})")
                    break
    return found


@contextlib.contextmanager
def _forked_random_state(model, shapes):
    """The global random state of the CPU and of the GPUs of ``model`` and ``shapes``, seeded with
    0 inside, restored on exit."""
    devices = {device for _, _, device in shapes}
    devices.update(t.device for t in (*model.parameters(), *model.buffers()))
    gpus = sorted({d.index for d in devices if d.type == "cuda"})
    with torch.random.fork_rng(devices=gpus):
        torch.default_generator.manual_seed(0)
        for index in gpus:
            torch.cuda.default_generators[index].manual_seed(0)
        yield


def _double_backward_error(module, shape, dtype, device):
    """The error text of differentiating a copy of ``module`` twice on a random input ('' if none)."""
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    probe = _copy(module)
    inputs = [x, *(p for p in probe.parameters() if p.requires_grad)]
    try:
        with torch.enable_grad():
            out = probe(x)
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                return ""
            grads = torch.autograd.grad((out**2).sum(), inputs, create_graph=True, allow_unused=True)
            second = [g.sum() for g in grads if g is not None and g.grad_fn is not None]
            if second:
                torch.autograd.grad(sum(second), inputs, allow_unused=True)
    except Exception as error:  # a layer that cannot take this input is not the one
        return str(error) + " "
    return ""


def _copy(module):
    """A copy of a leaf ``module`` with parameters of its own (detached: the same storage,
    other autograd leaves), cloned buffers (BatchNorm updates them) and no hooks.

    Shallow: a deep copy fails on tensors with a graph that the step left on modules.
    """
    probe = copy.copy(module)
    probe._parameters = OrderedDict(
        (name, None if p is None else torch.nn.Parameter(p.detach(), p.requires_grad))
        for name, p in module._parameters.items()
    )
    probe._buffers = OrderedDict((name, None if b is None else b.clone()) for name, b in module._buffers.items())
    for hooks in ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                  "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks"):
        if hasattr(module, hooks):
            setattr(probe, hooks, OrderedDict())
    return probe
