"""How one use of a tracked parameter is served at a step: by its layer's rule, a broadcast path, the
attention planner, or (``None``) the global path (see ``cockpit_lite.engine``, planning)."""

import torch
from torch.utils import _pytree as pytree

from cockpit_lite.engine.rules import GENERIC, UnsupportedCall, attention, mixes_samples, rule_for
from cockpit_lite.engine.step import as_if_batched, no_batch_axis
from cockpit_lite.utils.shards import module_class


def route_use(call, name, param, calls, mixing, state, graph):
    """How one use of a parameter is served: ``(call, name, path)``, or why it takes the global path (a
    string; empty where that holds at this step only and says nothing to the user)."""
    later = [m for m in mixing if m is not call and (call.end < m.start or call.contains(m))]
    if later:  # δ_n is not ∂c_n/∂output
        return f"a later {type(later[0].module).__name__} mixes the samples of the batch"
    if state.batch_size is None:
        return "the batch size is unknown"
    if module_class(call.module) is torch.nn.MultiheadAttention and mixes_samples(call):
        return "its MultiheadAttention takes an unbatched query [T, E]: it attends over the axis read as the samples'"
    if module_class(call.module) is torch.nn.MultiheadAttention and graph.ready():
        if call not in state.attention_nodes:
            state.attention_nodes[call] = attention.plan(
                graph._users, graph._accumulators, call.module, state.batch_size
            )
        if state.attention_nodes[call] is not None and name in attention.PARAMETERS:
            return (call, name, "attention")
    rule = GENERIC if "." in name else rule_for(call.module)
    if rule.parameters is not None and name not in rule.parameters:  # not the layer's (the old weight_norm's weight_g)
        path = graph.path_from_parameter(param, state.batch_size)
        return f"it is used outside its layer's own call, and {_NO_PATH}" if path is None else (None, name, path)
    if rule is GENERIC and mixes_samples(call):  # (timm's BatchNormAct2d: one sample alone is not the batch)
        return f"its layer {type(call.module).__name__} mixes the samples of the batch (batch statistics)"
    if rule is GENERIC and any(call.contains(c) for c in calls):
        if "." in name or mixing:  # own code around sub-module calls: only a shared parameter it uses
            return f"{type(call.module).__name__} runs its own code around its sub-modules' calls"
        path = graph.path_from_parameter(param, state.batch_size)
        return f"it is used outside its layer's own call, and {_NO_PATH}" if path is None else (None, name, path)
    if rule is GENERIC and call.buffers is None and call.buffers_moved():
        state.replays.add(call.module)  # its forward pass updated its buffers (spectral_norm's power iteration):
        return ""  # re-run from their values now, it would not be this call; its next calls keep copies
    if call not in state.shared:  # (once per call: a layer's parameters share the answer)
        state.shared[call] = shares_its_output(call, state.batch_size, graph)
    if state.shared[call]:
        if len(call.leaves) != 1:
            shapes = ", ".join(str(tuple(leaf.shape)) for leaf in call.leaves)
            return (f"the outputs of its {type(call.module).__name__}, of shapes {shapes}, have no axis of size "
                    f"{state.batch_size} (the batch)")
        try:
            rule.check(as_if_batched(call, state.batch_size), state.batch_size)
        except UnsupportedCall as error:
            return str(error)
        path = graph.path_from_tensor(call.leaves[0], state.batch_size)
        if path is None:
            return (f"the output of its {type(call.module).__name__}, of shape {tuple(call.leaves[0].shape)}, has no "
                    f"axis of size {state.batch_size} (the batch), and {_NO_PATH}")
        return (call, name, path)
    try:
        rule.check(call, state.batch_size)
    except UnsupportedCall as error:
        return str(error)
    return (call, name, None)


_NO_PATH = ("no path to where the batch comes in was found (one through the batch folded with another axis, a "
            "repeat or a gather is not followed)")


def shares_its_output(call, batch_size, graph):
    """Whether every sample shares ``call``'s output (it takes no samples, or its output has no batch axis,
    or is a tensor of length ``B`` that its consumers broadcast into the batch)."""
    shared = call.leaves and (
        takes_no_samples(call) or all(no_batch_axis(leaf, batch_size) for leaf in call.leaves)
    )
    if not shared and len(call.leaves) == 1 and graph.ready():  # a shared tensor of length B?
        shared = graph.broadcast_into_batch(call.leaves[0], batch_size)
    return bool(shared)


def takes_no_samples(call):
    """Whether no input of ``call`` can hold a sample: it has no tensor inputs (a
    parametrisation's ``ParametrizationList`` computing a weight from its own tensors, a learned
    table called without arguments) or only parameters. Its output is then shared by every
    sample, even when one of its axes is as long as the batch (``weight_norm(nn.Linear(64, B))``
    at B = 64), which the shapes alone would take for the batch axis."""
    if any(torch.is_tensor(a) and not isinstance(a, torch.nn.Parameter) for a in call.args):
        return False  # (the common case, a tensor argument, without walking the nested arguments)
    inputs = [t for t in pytree.tree_leaves((call.args, call.kwargs)) if torch.is_tensor(t)]
    return all(isinstance(t, torch.nn.Parameter) for t in inputs)
