"""Forward capture: which modules ran, on what, in which order, for the step about to be tracked.

``ForwardCapture`` puts a forward pre-hook and a forward hook on a set of modules. For
every call made with gradients enabled it keeps a ``Call``: the module, references to
its inputs (tensors autograd keeps alive anyway, as the layer's saved inputs), a ``Leaf``
for each output tensor (its place in the graph and its shape, not its memory: an output
that autograd does not save, a Linear's before a residual addition, is freed as without
the Cockpit), the start and end positions of the call among all calls (so that nesting and
order are known), and it registers a gradient hook on each output tensor that reports the
gradient w.r.t. that output (``δ``) during the backward pass (the hook lives on the
tensor's autograd node and fires after the tensor is freed). Nothing is copied and
nothing is computed.

The Cockpit installs the hooks only before a forward pass whose step is due (it
*arms* the capture at the end of the previous step, see ``cockpit_lite.engine``), so a
step where nothing is due runs without any hook.

Without the modules (a Cockpit given parameters only), the capture *discovers* them:
armed with ``modules=None``, it installs torch's global module hooks
(``register_module_forward_pre_hook`` / ``register_module_forward_hook``), which see
every module call of the process, and keeps the calls of the modules ``keep`` accepts
(those owning tracked parameters somewhere below them, and the layers that mix the
samples). Once the engine has found the modules, ``watch`` switches the capture to
ordinary per-module hooks; either way the hooks exist only while the capture is armed.
"""

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.modules import module as _module
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils import _pytree as pytree


@dataclass(frozen=True)
class Leaf:
    """What the engine reads of an output tensor, without its memory: its autograd node and
    output number (where it sits in the graph), shape, dtype and device."""

    grad_fn: Any
    output_nr: int
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, tensor):
        return cls(tensor.grad_fn, tensor.output_nr, tensor.shape, tensor.dtype, tensor.device)

    def dim(self):
        return len(self.shape)

    def zeros(self):
        """A gradient of zeros for it."""
        return torch.zeros(self.shape, dtype=self.dtype, device=self.device)


@dataclass(eq=False)
class Call:
    """One call of a module during the forward pass.

    Attributes:
        module: the module.
        name: its name in the model (``""`` for the model itself).
        args, kwargs: the inputs it was called with.
        leaves: ``Leaf`` stand-ins of the output's tensors that require a gradient (pytree leaves).
        leaf_positions: their positions among the output's pytree leaves.
        start, end: positions of the call's beginning and end in the sequence of all
            beginnings and ends (a call nested in another starts after it and ends before).
        grads: ``{leaf position: δ}``, filled during the backward pass.
        buffers_before: ``buffer_state`` of the module when the call began (``None``: it has no buffers).
        buffers: copies of the module's buffers as they were when the call began, for a module whose
            forward pass updates them (``ForwardCapture.snapshot``), else ``None``.
    """

    module: torch.nn.Module
    name: str
    args: tuple
    kwargs: dict
    start: int
    end: int = -1
    leaves: list = field(default_factory=list)
    leaf_positions: list = field(default_factory=list)
    grads: dict = field(default_factory=dict)
    buffers_before: Any = None
    buffers: Any = None

    def contains(self, other):
        """Whether ``other`` ran inside this call."""
        return self.start < other.start and other.end < self.end

    def buffers_moved(self):
        """Whether the module's buffers are no longer those the call began with (updated in place or
        reassigned since: by its own forward pass, as ``spectral_norm``'s power iteration updates
        its vectors before it uses them, or by a later call of the module)."""
        return self.buffers_before is not None and self.buffers_before != buffer_state(self.module)


def buffer_state(module):
    """The identity and in-place version of each of ``module``'s buffers (its submodules' included):
    equal before and after a forward pass that leaves them as they were."""
    return tuple((id(buffer), buffer._version) for buffer in module.buffers())


class ForwardCapture:
    """Hooks on ``modules`` that record ``Call`` objects (see the module docstring)."""

    def __init__(self, modules, on_grad, keep=None):
        """
        Args:
            modules: ``{module: name}`` of the modules to watch, or ``None``: every
                module call of the process that ``keep`` accepts (global hooks).
            on_grad: ``on_grad(call, leaf position, δ)``, called during the backward pass.
            keep: ``keep(module) -> bool`` for ``modules=None``.
        """
        self.modules = modules
        self.on_grad = on_grad
        self.keep = keep
        self.saw_a_call = False  # global hooks: whether any module ran while armed
        self.snapshot = weakref.WeakSet()  # modules whose calls keep copies of their buffers (``Call.buffers``)
        self._buffered = weakref.WeakKeyDictionary()  # module -> whether it has buffers
        self.calls = []
        self.paused = False
        self._open = {}
        self._counter = 0
        self._module_handles = []
        self._tensor_handles = []

    @property
    def armed(self):
        return bool(self._module_handles)

    def arm(self):
        """Install the module hooks (no-op if installed)."""
        if self.armed:
            return
        if self.modules is None:  # global hooks hold the capture weakly: a Cockpit dropped unclosed
            ref = weakref.ref(self)  # leaves no hook behind once it is collected

            def pre(module, args):
                capture = ref()
                if capture is not None:
                    capture._global_pre(module, args)

            def post(module, args, kwargs, output):
                capture = ref()
                if capture is not None:
                    capture._post(module, args, kwargs, output)

            for handle in (_module.register_module_forward_pre_hook(pre),
                           _module.register_module_forward_hook(post, with_kwargs=True)):
                self._module_handles.append(handle)
                weakref.finalize(self, handle.remove)
            return
        for module in self.modules:
            self._module_handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._module_handles.append(module.register_forward_hook(self._post, with_kwargs=True))

    def watch(self, modules):
        """From now on watch ``modules`` (``{module: name}``) with per-module hooks.

        The calls recorded so far and their gradient hooks are kept; armed global hooks
        are replaced by the per-module ones.
        """
        armed = self.armed
        for handle in self._module_handles:
            handle.remove()
        self._module_handles = []
        self.modules, self.keep = modules, None
        if armed:
            self.arm()

    def disarm(self):
        """Remove the module hooks and forget every call."""
        for handle in self._module_handles:
            handle.remove()
        self._module_handles = []
        self.clear()

    def clear(self):
        """Forget the recorded calls and remove their gradient hooks."""
        for handle in self._tensor_handles:
            handle.remove()
        self._tensor_handles = []
        self.calls = []
        self._open = {}
        self._counter = 0

    def _pre(self, module, args, kwargs):
        if self.paused or not torch.is_grad_enabled():
            return None
        buffers = self._buffered.get(module)
        if buffers is None:
            buffers = self._buffered[module] = any(True for _ in module.buffers())
        before = copies = None
        if buffers:
            before = buffer_state(module)
            if module in self.snapshot:
                copies = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
        self._open.setdefault(module, []).append((self._counter, before, copies))
        self._counter += 1
        return None

    def _global_pre(self, module, args):
        self.saw_a_call = True
        if self.keep(module):
            self._pre(module, args, None)
        return None

    def _post(self, module, args, kwargs, output):
        starts = self._open.get(module)
        if self.paused or not starts:
            return None
        name = self.modules[module] if self.modules is not None else ""
        start, before, copies = starts.pop()
        call = Call(module, name, args, kwargs, start, self._counter, buffers_before=before, buffers=copies)
        self._counter += 1
        for position, leaf in enumerate(pytree.tree_leaves(output)):
            if torch.is_tensor(leaf) and leaf.requires_grad:
                call.leaves.append(Leaf.of(leaf))
                call.leaf_positions.append(position)
                self._tensor_handles.append(leaf.register_hook(self._grad_hook(call, len(call.leaves) - 1)))
        self.calls.append(call)
        return None

    def _grad_hook(self, call, position):
        def hook(grad):
            self.on_grad(call, position, grad)

        return hook


def ownership(model, index):
    """``(owners, parents, modules)``.

    ``owners[i]``: the ``(module, attribute name)`` pairs holding tracked parameter ``i``
    (several for a tied parameter); ``parents[module] = (parent, name in parent)``;
    ``modules``: ``{module: name}`` to watch (owners, their ancestors and BatchNorm layers).
    """
    owners, parents, names = {}, {}, {}
    for name, module in model.named_modules():  # a module registered twice (ModuleList([block] * n)) once
        names.setdefault(module, name)
        for child_name, child in module.named_children():
            parents.setdefault(child, (module, child_name))
        for attribute, param in module._parameters.items():
            if param is not None and id(param) in index:
                owners.setdefault(index[id(param)], []).append((module, attribute))
    watched = {model}
    for pairs in owners.values():
        for module, _ in pairs:
            while module is not None and module not in watched:
                watched.add(module)
                module = parents.get(module, (None, None))[0]
    watched |= {m for m in names if isinstance(m, _BatchNorm)}
    return owners, parents, {m: names[m] for m in names if m in watched}
