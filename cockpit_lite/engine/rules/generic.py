"""Every other module: re-run it per sample with ``torch.func`` and differentiate.

For a call ``y = M(x; θ_M)`` with output gradient ``δ = ∂L/∂y``, sample n's gradient of
the module's own parameters is ``∇_θ <δ_n, M(x_n; θ)>`` when ``M`` treats the samples
independently: the module is run on sample n alone (a batch of one, so layers that
expect a batch axis keep it), and ``torch.func.vmap`` over the samples vectorises
it. This covers LayerNorm-like custom layers, attention (``nn.MultiheadAttention``,
including ``out_proj``, which it uses without calling it), recurrent layers in any
layout and read-out (``h_n`` and the outputs), and custom modules. Where ``vmap``
cannot run a module (an operation without a batching rule) the samples are run in a
loop instead. A module that draws random numbers (dropout inside it) cannot be re-run
faithfully: ``UnsupportedCall``, and the engine uses the exact global path.

The re-run leaves the model and the user's random streams as they were: it runs on
clones of the module's buffers (a running statistic its forward updates is updated
there; each sample's run starts from the same values), in the module's own mode, under a forked random state (the CPU's and that of
every GPU of the call's tensors), whose change at the first sample of the loop is how a
module drawing random numbers is detected (``vmap`` refuses random operations itself).

The re-run uses the math kernel of scaled-dot-product attention (vmap has batching rules
for its operations, not for the fused CPU kernel); the user's own forward pass is untouched.

A module whose forward pass updates its buffers before it uses them (``spectral_norm``'s power
iteration moves its vectors at every call in training mode) would not compute the same output
again from their values after the call: the engine routes such a call to the global path
(``Call.buffers_moved``) and from then on the capture keeps copies of the module's buffers as
they were when each call began (``Call.buffers``), from which the re-run starts.

Batch axes: the recurrent layers and attention follow their ``batch_first``; any
other tensor's batch axis is its first axis of the batch size (none: shared by all
samples, e.g. an attention mask).
"""

import inspect

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils.stateless import _reparametrize_module
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import _pytree as pytree

from cockpit_lite.engine.rules.base import (
    Rule, UnsupportedCall, batch_axis, compute_dtype, output_grad, quiet_batching_fallback, rerun,
)
from cockpit_lite.engine.per_sample import PerSample
from cockpit_lite.utils.shards import module_class, whole


class GenericRule(Rule):
    in_backward = False
    parameters = None

    def __init__(self):
        self._loop = set()  # module types vmap could not run

    def check(self, call, batch_size):
        module = call.module
        dropout = getattr(module, "dropout", 0.0)
        if module.training and isinstance(dropout, float) and dropout > 0:
            raise UnsupportedCall(f"{type(module).__name__} applies dropout inside")
        flat, names, _ = _flatten(module, call.args, call.kwargs)
        _input_axes(module, flat, names, batch_size)
        _output_axes(module, call, batch_size)

    def per_sample(self, call, tracked, batch_size):
        module = call.module
        flat, names, rebuild = _flatten(module, call.args, call.kwargs)
        in_axes = _input_axes(module, flat, names, batch_size)
        out_axes = _output_axes(module, call, batch_size)
        dtype = compute_dtype(*[t for t in flat if torch.is_tensor(t)], *[p for _, p, _ in tracked])
        params = {name: whole(param).detach().to(dtype) for name, param, _ in tracked}  # (FSDP2: gathered)
        buffers = call.buffers if call.buffers is not None else dict(module.named_buffers())
        buffers = {name: buffer.detach() for name, buffer in buffers.items()}
        inputs = [
            _cast(flat[i].detach(), dtype).unsqueeze(axis + 1) for i, axis in in_axes.items()
        ]
        deltas = [_cast(output_grad(call, k).detach(), dtype).unsqueeze(axis + 1) for k, axis in enumerate(out_axes)]
        constants = [_cast(t.detach(), dtype) if torch.is_tensor(t) else t for t in flat]
        positions = call.leaf_positions

        def objective(theta, batched, grads):
            leaves = list(constants)
            for i, value in zip(in_axes, batched):
                leaves[i] = value
            args, kwargs = rebuild(leaves)
            state = {name: buffer.clone() for name, buffer in buffers.items()}  # (each sample's run from the call's)
            outputs = pytree.tree_leaves(_call(module, {**state, **theta}, args, kwargs))
            return sum((g * outputs[p]).sum() for p, g in zip(positions, grads))

        device = inputs[0].device.type if inputs else "cpu"
        gpus = sorted({t.device.index for t in (*inputs, *deltas, *params.values()) if t.device.type == "cuda"})
        with (
            torch.random.fork_rng(devices=gpus), torch.enable_grad(), torch.autocast(device, enabled=False),
            sdpa_kernel(SDPBackend.MATH), rerun(), quiet_batching_fallback(),
        ):
            grads = None
            if type(module) not in self._loop:
                try:
                    grads = vmap(grad(objective), in_dims=(None, list(in_axes.values()), out_axes))(params, inputs, deltas)
                except RuntimeError as error:
                    if "random" in str(error):
                        raise UnsupportedCall(f"{type(module).__name__} draws random numbers (dropout)") from None
                    self._loop.add(type(module))
            if grads is None:
                grads = _loop(
                    objective, params, inputs, list(in_axes.values()), deltas, out_axes, batch_size, module, gpus
                )
        return {
            name: PerSample(param, index, grad_batch=grads[name].reshape(batch_size, *param.shape))
            for name, param, index in tracked
        }


def _call(module, state, args, kwargs):
    """``functional_call``; a module ``fully_shard``-ed by FSDP2 without its hooks, which would
    all-gather and put its own (unsharded) parameters in place of ``state``'s."""
    if module_class(module) is type(module):
        return functional_call(module, state, args, kwargs)
    with _reparametrize_module(module, state):
        return module.forward(*args, **kwargs)


def _loop(objective, params, inputs, in_dims, deltas, out_dims, batch_size, module, gpus):
    """The samples one at a time (for modules ``vmap`` cannot run), under the caller's forked
    random state; ``UnsupportedCall`` if the first sample moves the CPU's or a GPU's (``gpus``)."""
    theta = {name: p.clone().requires_grad_(True) for name, p in params.items()}
    results = {name: [] for name in params}
    states = _random_states(gpus)
    for n in range(batch_size):
        batched = [x.select(axis, n) for x, axis in zip(inputs, in_dims)]
        grads = [d.select(axis, n) for d, axis in zip(deltas, out_dims)]
        values = torch.autograd.grad(objective(theta, batched, grads), list(theta.values()), allow_unused=True)
        if n == 0 and not all(torch.equal(a, b) for a, b in zip(states, _random_states(gpus))):
            raise UnsupportedCall(f"{type(module).__name__} draws random numbers (dropout)")
        for (name, p), value in zip(theta.items(), values):
            results[name].append(torch.zeros_like(p) if value is None else value)
    return {name: torch.stack(values) for name, values in results.items()}


def _random_states(gpus):
    """The global random state of the CPU and of the GPUs ``gpus`` (indices)."""
    return [torch.random.get_rng_state(), *(torch.cuda.get_rng_state(index) for index in gpus)]


def _cast(tensor, dtype):
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _flatten(module, args, kwargs):
    """``(leaves, names, rebuild)``: the tensors and other values among a call's inputs, the
    name of the argument each comes from, and ``rebuild(leaves) -> (args, kwargs)``."""
    try:
        positional = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        positional = []
    items = [(positional[i] if i < len(positional) else f"arg{i}", value) for i, value in enumerate(args)]
    items += list(kwargs.items())
    leaves, names, specs = [], [], []
    for name, value in items:
        parts, spec = pytree.tree_flatten(value)
        leaves += parts
        names += [name] * len(parts)
        specs.append((name, spec, len(parts)))

    def rebuild(values):
        rebuilt, offset = [], 0
        for name, spec, count in specs:
            rebuilt.append(pytree.tree_unflatten(values[offset : offset + count], spec))
            offset += count
        return tuple(rebuilt[: len(args)]), dict(zip(kwargs, rebuilt[len(args) :]))

    return leaves, names, rebuild


_DATA_ARGUMENTS = {"input", "query", "key", "value"}


def _input_axes(module, leaves, names, batch_size):
    """``{position among the leaves: batch axis}`` of the inputs that hold one entry per sample."""
    axes = {}
    for i, (name, value) in enumerate(zip(names, leaves)):
        if not torch.is_tensor(value):
            continue
        preferred = None
        if isinstance(module, (nn.RNNBase, nn.MultiheadAttention)):
            if name in _DATA_ARGUMENTS:
                preferred = 0 if module.batch_first else 1
            elif name == "hx":
                preferred = 1
            elif name == "key_padding_mask":
                preferred = 0
            elif name == "attn_mask":
                if value.dim() == 3:
                    raise UnsupportedCall("a 3-d attention mask mixes the batch with the heads")
                continue  # one mask for every sample
        if preferred is not None:
            axes[i] = batch_axis(value, batch_size, preferred)
            continue
        try:
            axes[i] = batch_axis(value, batch_size)
        except UnsupportedCall:
            pass  # shared by all samples
    return axes


def output_axes(call, batch_size):
    """The batch axis of each output tensor of ``call`` that got a gradient, as the rules read its rows:
    the ``batch_first`` layout's for a recurrent layer's output and attention's (then 1 for a recurrent
    layer's ``h_n``/``c_n``, 0 for attention weights), else its first axis of size ``batch_size``
    (``None``: the output has no such axis)."""
    module = call.module
    preferred = None
    if isinstance(module, (nn.RNNBase, nn.MultiheadAttention)):
        preferred = 0 if module.batch_first else 1
    axes = []
    for position, leaf in zip(call.leaf_positions, call.leaves):
        if isinstance(module, nn.RNNBase):
            axis = preferred if position == 0 else 1  # out, then h_n (and c_n)
        elif isinstance(module, nn.MultiheadAttention):
            axis = preferred if position == 0 else 0  # output, then attention weights
        else:
            axis = next((k for k, size in enumerate(leaf.shape) if size == batch_size), None)
        axes.append(axis if axis is not None and axis < leaf.dim() and leaf.shape[axis] == batch_size else None)
    return axes


def _output_axes(module, call, batch_size):
    """``output_axes``; ``UnsupportedCall`` for an output without a batch axis."""
    axes = output_axes(call, batch_size)
    for leaf, axis in zip(call.leaves, axes):
        if axis is None:
            raise UnsupportedCall(f"an output of shape {tuple(leaf.shape)} without its batch axis of size {batch_size}")
    return axes
