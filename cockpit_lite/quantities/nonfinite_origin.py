"""``NonfiniteOrigin``: where the first non-finite value of a step's forward pass appeared.

Every step, one forward pre-hook on the model keeps a reference to the forward pass's inputs
(tensors the step holds anyway) with the random state and autocast settings it started with.
Before the backward pass (``needs``), the loss is checked once (``math.isfinite(loss.item())``;
on a GPU the step's only host synchronisation the diagnosis adds, needed because the op can only
be named while the graph still holds its saved tensors); when it is finite the references are
dropped, nothing is recorded and the step is not due for this signal. When it is not, the
forward pass is *replayed* on the same inputs, parameters, random state (the same dropout masks)
and autocast settings, with a forward hook on every module that keeps each module's output in
the order the calls *end* (a module ends before the module that contains it); the model's
buffers and the tensors its modules hold as attributes (what a forward hook stored, e.g.
BackPACK's inputs and outputs, which its backward reads) are put back afterwards and the user's
random state is left as it was. A model whose own forward the training loop does not call (a
``ModuleDict`` of parts, a loop calling the parts itself) is watched by those hooks at every
step instead, from the first step whose forward did not run through the model. Then, still
before the backward pass:

- ``module``: ``"input"`` if the model's first floating-point tensor argument (positional,
  then keyword) holds a NaN or a +Inf (not −Inf alone: that is an additive attention mask's,
  as ``nn.Transformer.generate_square_subsequent_mask`` makes them, passed after integer
  token ids; a batch whose only non-finite values are −Inf is named by the first module it
  makes non-finite), else the first module (in that order) whose output is
  non-finite, else ``"loss_fn"`` (the model's output is finite, the loss is not);
  ``None`` when no module's output was seen in the step's forward pass (a Cockpit given
  parameters only finds the modules in its first tracked forward pass, so step 0's ran
  unwatched): the place is unknown, the op is still named from the loss's graph;
- ``op``: the operation that made the first non-finite value. The autograd graph of
  that output (of the loss for ``"loss_fn"``) is walked towards the inputs; a node is
  a *creator* when its saved inputs are finite and its result (saved, or recomputed
  from the saved inputs for ``OPS``) is not; a creator with no creator below it (the
  earliest in the computation) names the op (``LogBackward0`` → ``"log"``). Without a
  creator (e.g. a matrix product overflowing, or parameters that are non-finite
  already) it is the output node's own op;
- ``params_nonfinite``: whether the module's own parameters were non-finite already
  (a previous update diverged).

The graph walk happens at the first ``MAX_ANALYSED`` non-finite steps only; later ones
record ``module`` alone. A forward pass with side effects beyond buffers (a Python counter, a
cache) has them twice at a non-finite step.

Under torch.distributed (DDP, FSDP2) a rank's loss can be non-finite where the others' are not
(a bad sample in its part of the batch), and a step that only one rank tracks would leave the
others waiting in its collectives. So each rank locates the first non-finite value of its own
loss as above, keeps it (with ``"step"`` and ``"rank"``), and the signal is recorded at the next
step the Cockpit tracks anyway (``Quantity.RANK_LOCAL``; the diagnosis's own schedule: within
``EVERY`` steps): the ranks' kept origins are gathered and the earliest is recorded (rank 0
keeps the record). The forward pass is not replayed on a model sharded by FSDP2 or holding a
``SyncBatchNorm`` (their forward passes are collectives of all ranks): the module stays unknown,
the op is named from the loss's graph.
"""

import contextlib
import math
import re

import torch
import torch.distributed as dist

from cockpit_lite.engine.global_path import kept_buffers

from cockpit_lite.quantities.base import Needs, Output, Quantity, floating_inputs, input_module, user_forward
from cockpit_lite.utils.shards import local

MAX_ANALYSED = 3
MAX_NODES = 20000

OPS = {
    "LogBackward0": ("log", lambda n: torch.log(n._saved_self)),
    "Log2Backward0": ("log", lambda n: torch.log2(n._saved_self)),
    "Log10Backward0": ("log", lambda n: torch.log10(n._saved_self)),
    "Log1PBackward0": ("log", lambda n: torch.log1p(n._saved_self)),
    "DivBackward0": ("div", lambda n: n._saved_self / n._saved_other),
    "MulBackward0": ("mul", lambda n: n._saved_self * n._saved_other),
    "PowBackward0": ("pow", lambda n: torch.pow(n._saved_self, n._saved_exponent)),
    "XlogyBackward0": ("log", lambda n: torch.xlogy(n._saved_self, n._saved_other)),
}
"""Autograd nodes that do not save their result: ``name -> (op, recompute from saved inputs)``."""

LABELS = {"ExpBackward0": "exp", "SqrtBackward0": "sqrt", "RsqrtBackward0": "rsqrt",
          "ReciprocalBackward0": "div", "PowBackward1": "pow"}
"""Op names of nodes that save their result."""

DIVISIONS = ("DivBackward0", "DivBackward1", "DivBackward2")
"""Division nodes (by a tensor, by a Python number: ``aten.div.Scalar``, with a ``rounding_mode``): one
whose saved divisor holds a 0 creates a non-finite value (its finite inputs checked first), whether or
not the numerator was saved (``a / d`` with ``d`` not requiring a gradient saves ``d`` only)."""


class NonfiniteOrigin(Quantity):
    """The module (or ``"loss_fn"`` / ``"input"``) and op of the first non-finite value.

    Saved state (``STATE``): how many graph walks were spent (of ``MAX_ANALYSED``).
    """

    TIER = 0  # (overhead budget: bookkeeping)

    NEEDS_BACKWARD = False  # (of the forward pass: recorded where the loop skips the backward of a bad loss too)

    RANK_LOCAL = True  # (a rank's own loss)

    STATE = ("_analysed", "_pending")

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._handles = []
        self._module_handles = []  # forward hooks on every module (a replay, or a model not called itself)
        self._model = None
        self._outputs = []
        self._input = None
        self._call = None  # (module, args, kwargs, random states, autocast) of this step's forward pass
        self._watched = False  # whether a forward pass since ``watch`` could have been seen
        self._given = lambda: False  # whether the Cockpit was given the model (``watch`` runs before its passes)
        self._value = None
        self._analysed = 0
        self._group = None  # torch.distributed: the ranks whose kept origins ``compute`` gathers
        self._pending = None  # under torch.distributed: this rank's first origin not recorded yet

    def bind(self, cockpit):
        self._given = lambda: cockpit.model is not None
        self._group = cockpit.group

    def watch(self, model):
        self._model = model
        self._watched = self._given()  # (a model found from its parameters has run the step's forward pass)
        root = input_module(model)
        self._handles.append(root.register_forward_pre_hook(self._pre, with_kwargs=True))
        if isinstance(model, torch.nn.ModuleList) or type(root).forward is torch.nn.Module.forward:
            self._hook_modules()  # no forward of its own to replay (a ModuleDict, several found parts)

    def unbind(self):
        for handle in self._handles + self._module_handles:
            handle.remove()
        self._handles, self._module_handles = [], []
        self._outputs = []
        self._input = self._call = self._model = None

    def _hook_modules(self):
        if not self._module_handles and self._model is not None:
            self._module_handles = [module.register_forward_hook(self._post(name))
                                    for name, module in self._model.named_modules()]

    def _unhook_modules(self):
        for handle in self._module_handles:
            handle.remove()
        self._module_handles = []

    def _pre(self, module, args, kwargs):
        if user_forward():
            self._outputs = []
            tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
            self._input = next(iter(floating_inputs(args, kwargs)), None)
            first = tensors[0] if tensors else None  # (where the forward pass runs)
            devices = [first.device.index] if first is not None and first.device.type == "cuda" else []
            self._call = (module, args, kwargs, _random_states(devices), _autocast())

    def _post(self, name):
        def hook(module, args, output):
            if user_forward():
                tensor = output if torch.is_tensor(output) else next(
                    (o for o in (output if isinstance(output, (tuple, list)) else ()) if torch.is_tensor(o)), None)
                if tensor is not None and tensor.is_floating_point():
                    self._outputs.append((name, module, tensor))

        return hook

    def needs(self, step, info):
        outputs, inputs, call = self._outputs, self._input, self._call
        self._outputs, self._input, self._call, self._value = [], None, None, None
        if call is None and torch.is_tensor(info.get("loss")) and self._model is not None and self._watched:
            self._hook_modules()  # the loop called the parts, not the model: watch every module from now on
        self._watched = self._model is not None  # (the step the model was found in ran before the hooks)
        if not self.is_due(step):
            return None
        loss = info.get("loss")
        if torch.is_tensor(loss) and self._pending is None and not _finite(loss):
            if call is not None and not self._module_handles and self._replayable():
                outputs = self._replay(call)
            self._value = self._locate(loss, outputs, inputs)
            if self._group is not None:  # (recorded at a step the Cockpit tracks anyway, ``compute``)
                self._pending, self._value = {**self._value, "step": step, "rank": self._group.rank}, None
        # a finite loss records nothing: the step stays untracked for this signal
        return Needs() if self._value is not None or self._group is not None else None

    def _replayable(self):
        """Whether the forward pass can run again on this rank alone (not FSDP2's, nor a ``SyncBatchNorm``'s)."""
        return self._group is None or not (self._group.sharded or any(
            isinstance(module, torch.nn.SyncBatchNorm) for module in self._model.modules()))

    def _replay(self, call):
        """The outputs of every module in a replay of the step's forward pass (see the module docstring)."""
        module, args, kwargs, states, autocast = call
        devices = [device for device, _ in states[1:]]
        self._hook_modules()
        try:
            with torch.random.fork_rng(devices=devices), kept_buffers(self._model), \
                    _kept_attributes(self._model), torch.enable_grad():
                torch.set_rng_state(states[0])
                for device, state in states[1:]:
                    torch.cuda.set_rng_state(state, device)
                with torch.autocast(**autocast) if autocast else contextlib.nullcontext():
                    module(*args, **kwargs)
            return self._outputs
        except Exception:  # a forward that cannot run twice: the place stays unknown, the op is still named
            return []
        finally:
            self._unhook_modules()
            self._outputs = []

    def _locate(self, loss, outputs, inputs):
        finite = [bool(f) for f in torch.stack([torch.isfinite(t.detach()).all() for _, _, t in outputs]).tolist()] \
            if outputs else []
        module, node, params_bad = "loss_fn" if outputs else None, loss.grad_fn, False
        if inputs is not None and bool((torch.isnan(inputs) | (inputs == math.inf)).any()):  # (−Inf: a mask's)
            module, node = "input", None
        else:
            bad = next((i for i, ok in enumerate(finite) if not ok), None)
            if bad is not None:
                name, mod, tensor = outputs[bad]
                module, node = name, tensor.grad_fn
                # (FSDP2: this rank's rows; a whole sharded parameter's check would be a collective of one rank)
                params_bad = not all(bool(torch.isfinite(local(p)).all()) for p in mod.parameters(recurse=True))
        value = {"module": module, "op": "input" if module == "input" else None, "params_nonfinite": params_bad}
        if node is not None and self._analysed < MAX_ANALYSED:
            self._analysed += 1
            value["op"] = creator_op(node)
        return value

    def compute(self, step, data):
        if self._group is not None:  # every rank's kept origin: the earliest is recorded
            ranks = [None] * self._group.world
            dist.all_gather_object(ranks, self._pending, group=self._group.process_group)
            self._pending = None
            kept = [origin for origin in ranks if origin is not None]
            return Output(min(kept, key=lambda origin: (origin["step"], origin["rank"]))) if kept else None
        value, self._value = self._value, None
        return None if value is None else Output(value)


@contextlib.contextmanager
def _kept_attributes(model):
    """Run with the tensors ``model``'s modules hold as plain attributes put back (new ones removed)."""
    saved = [(m, {k: v for k, v in vars(m).items() if torch.is_tensor(v)}) for m in model.modules()]
    try:
        yield
    finally:
        for module, tensors in saved:
            for key in [k for k, v in vars(module).items() if torch.is_tensor(v) and k not in tensors]:
                delattr(module, key)
            vars(module).update(tensors)


def _random_states(devices):
    """The CPU's random state, then ``(device, state)`` of each GPU in ``devices``."""
    return [torch.get_rng_state(), *((d, torch.cuda.get_rng_state(d)) for d in devices)]


def _autocast():
    """The keyword arguments of ``torch.autocast`` active now (on the CPU or a GPU), or ``None``."""
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return {"device_type": device, "dtype": torch.get_autocast_dtype(device)}
    return None


def _finite(loss):
    """Whether every entry of ``loss`` is finite; a one-element loss through ``item()`` (on the CPU
    0.6 µs against 18 µs for ``bool(torch.isfinite(loss).all())``, every step; the same one
    host synchronisation on a GPU)."""
    if loss.numel() == 1:
        return math.isfinite(loss.item())
    return bool(torch.isfinite(loss.detach()).all())


def creator_op(root):
    """Name of the op that created the first non-finite value in the graph below ``root``.

    The graph is walked depth first and each node is tested once all the nodes below it
    are: the first creator so found has no creator below it. A node that saves only its
    result (``tanh``, ``sigmoid``, ``exp``, ...) looks like a creator when its input was
    non-finite already; the creator below it is the one named, even where the node is
    deeper than that creator on another path (``torch.sigmoid(h) * h``).
    """
    seen, stack = {root}, [(root, iter(root.next_functions))]
    while stack:
        node, children = stack[-1]
        child = next((c for c, _ in children if c is not None and c not in seen), None) \
            if len(seen) < MAX_NODES else None
        if child is None:
            stack.pop()
            if _creates_nonfinite(node):
                return op_name(node)
        else:
            seen.add(child)
            stack.append((child, iter(child.next_functions)))
    return op_name(root)


def op_name(node):
    """``LogBackward0`` -> ``"log"`` (the labels of ``OPS``/``LABELS``, else the node name)."""
    name = type(node).__name__
    if name in OPS:
        return OPS[name][0]
    if name in LABELS:
        return LABELS[name]
    return re.sub(r"Backward\d*$", "", name).lower()


def _saved(node):
    values = {}
    for attr in dir(node):
        if attr.startswith("_saved_"):
            try:
                value = getattr(node, attr)
            except RuntimeError:  # freed
                continue
            if torch.is_tensor(value):
                values[attr] = value
    return values


def _nonfinite(tensor):
    return tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())


def _zero_divisor(node):
    try:
        other = node._saved_other
    except (AttributeError, RuntimeError):
        return False
    if torch.is_tensor(other):
        return bool((other == 0).any())
    return isinstance(other, (int, float)) and other == 0


def _creates_nonfinite(node):
    """Whether ``node``'s saved inputs are finite and its result is not."""
    name = type(node).__name__
    if name not in OPS and name not in LABELS and name not in DIVISIONS and not hasattr(node, "_saved_result"):
        return False
    saved = _saved(node)
    result = saved.pop("_saved_result", None)
    if any(_nonfinite(t) for t in saved.values()):
        return False
    if name in DIVISIONS and _zero_divisor(node):
        return True  # finite / 0 is ±inf or NaN: no need for the numerator (not saved when the divisor needs no grad)
    if result is None and name in OPS:
        try:
            with torch.no_grad():
                result = OPS[name][1](node)
        except (AttributeError, RuntimeError, TypeError):
            return False
    return result is not None and torch.is_tensor(result) and _nonfinite(result)
