"""One step of the engine: what it collects (``Step``), the step's autograd graph walked on demand
(``Graph``), and what the engine does to a step's calls and results."""

import dataclasses

import torch

from cockpit_lite.engine import transforms as _transforms
from cockpit_lite.engine.per_sample import Scratch
from cockpit_lite.engine import broadcast
from cockpit_lite.engine.capture import Call


class Step:
    """What one step's engine collects."""

    def __init__(self, transforms, batch_size, grads_before, needed_by, window=None, group=None, subset=None):
        self.window = window
        self.subset = subset  # the sample indices of a subsampled step (``cockpit_lite.subsample``), or None
        self.sharded = group if group is not None and group.sharded else None  # FSDP2 (``cockpit_lite.sharded``)
        self.distributed = group is not None and self.sharded is None  # DDP
        self.deferred = window is not None or self.distributed  # the transforms run once the step's gradient is known
        self.pending = {}
        self.transforms = tuple(transforms)
        self.batch_size = batch_size
        self.grads_before = grads_before
        self.needed_by = tuple(needed_by)
        self.calls = {}  # call -> [(name, param, index)]
        self.broadcast = {}  # call whose output all samples share -> [(name, param, index)]
        self.attention = {}  # MultiheadAttention call served from its projections -> [(name, param, index)]
        self.attention_nodes = {}
        self.global_reasons = {}  # index -> why its use takes the global path at this step (``routes.route_use``)
        self.shared = {}  # call -> whether every sample shares its output (``routes.shares_its_output``)
        self.replays = set()  # modules whose forward pass updated their buffers: their next calls keep copies
        self.paths = []
        self.uses = {}
        self.done = set()
        self.dense = {}  # a parameter with several uses: {"parts": uses in their own form, "sum": the others'}
        self.dense_grads = {}  # subsampled: per multi-use parameter, the sum of its uses' gradients of all B
        self.results = {}
        self.served = {}  # index -> the gradient the engine's individual gradients sum to (None: not checked)
        self.global_path = set()  # indices served by the global path
        self.failed = set()
        self.flags = []
        self.low_precision = False
        self.repeated = False  # a served layer's output received a second gradient: backward ran again
        self.batch = _transforms.Batch()
        self.scratch = Scratch()  # the memory the chunks of built individual gradients are formed in
        self.from_autograd = set()  # subsampled: parameters whose transforms take ``g`` from autograd
        self.waiting = {}  # index -> (the subsample's PerSample, its results) until autograd's ``g`` is known
        self.checks = {}  # index -> ``PerSample.check``'s (value, project), checked by ``cockpit_lite.engine.check``
        self.generator = None
        self.seeds = {}  # subsampled: per parameter of several uses, the seed of their common sketch
        self.hooked = set()  # indices of parameters served by hooks on graph nodes (attention, shared tensors)
        self.pseudo = None  # a pseudo-loss's samples' terms (``Engine.pseudo_pass``), or None: the user's pass
        self.noise = set()  # indices whose gradient is zero up to rounding (``cockpit_lite.engine.check``)
        self.resummed = {}  # global path: index -> the sum of its individual gradients, beside their total
        self.true_grads = None  # a pseudo-loss pass: autograd's gradient of it per parameter index
        self.unreached = ()  # indices of trainable parameters the loss's graph does not reach: zero individual gradients

    def takes_autograd_grad(self, index):
        """Whether parameter ``index``'s transforms take ``g`` from autograd at this step (a low-precision
        backward pass keeps the rules' sum, unless a use has already been sketched)."""
        return index in self.from_autograd and (index in self.checks or not self.low_precision)

    def of_info_loss(self, index):
        """Whether parameter ``index``'s individual gradients are those of ``info["loss"]`` whatever the layers
        do: the global path's vector-Jacobian products, or the zeros of a parameter the loss's graph does not
        reach. Autograd's gradient differing from their sum means that backward ran on another loss."""
        return index in self.global_path or index in self.unreached

    @property
    def held(self):
        """The number of samples whose individual gradients the transforms see (``k`` or ``B``)."""
        return len(self.subset) if self.subset is not None else self.batch_size

    def ready(self, index, per_sample):
        """Run the transforms on a parameter's complete individual gradients (later, if deferred).

        A subsampled step's transforms see the subsample's rows only, with the gradient of all
        ``B`` samples: autograd's for a parameter in ``from_autograd`` (the transforms that read
        it wait for it in ``waiting``, until ``Engine._on_accumulated``; the check against
        autograd is ``PerSample.check``, prepared here from all samples), else the sum of the
        individual gradients (which the check reads)."""
        if self.subset is not None and per_sample.num_samples == self.batch_size:
            per_sample = per_sample.select(self.subset.to(per_sample.param.device))
        if self.takes_autograd_grad(index):
            if index not in self.checks:  # (one of several uses: their sketches, from ``Engine._accept``)
                self.checks[index] = per_sample.check(self.generator)
            now = [t for t in self.transforms if not t.reads_grad]
            self.results[index] = _transforms.run(now, per_sample, self.batch, self.scratch)
            if len(now) < len(self.transforms):
                self.waiting[index] = (per_sample, self.results[index])
            return
        if self.deferred:
            self.pending[index] = per_sample
            if not self.distributed:  # each accumulated pass is checked on its own
                self.served[index] = per_sample.grad
            return
        self.results[index], self.served[index] = self.run(per_sample)

    def run(self, per_sample):
        """``(results, gradient to check)`` of the transforms on one parameter's individual gradients,
        at once (FSDP2: ``ShardedGroup.run``, this rank's rows of the gradient)."""
        if self.sharded is not None:
            return self.sharded.run(self.transforms, per_sample, self.batch, self.scratch)
        return _transforms.run(self.transforms, per_sample, self.batch, self.scratch), per_sample.grad


class Graph:
    """The autograd graph of the step's loss, walked once, on demand (``cockpit_lite.engine.broadcast``)."""

    def __init__(self, loss, aliases=None):
        self._loss = loss
        self._users = None
        self._aliases = aliases or {}  # id(a leaf of the graph) -> the tracked parameter it stands for (FSDP2)

    def ready(self):
        """Whether the loss has a graph (walked on the first call)."""
        if self._users is None:
            self._root = getattr(self._loss, "grad_fn", None)
            self._users = broadcast.consumers(self._root) if self._root is not None else {}
            self._accumulators = broadcast.accumulators(self._users)
            for leaf, param in self._aliases.items():
                if leaf in self._accumulators:
                    self._accumulators[id(param)] = self._accumulators[leaf]
        return self._root is not None

    def reaches(self, tensor):
        """Whether the loss depends on ``tensor``."""
        return tensor.grad_fn is self._root or (tensor.grad_fn, tensor.output_nr) in self._users

    def misses(self, param):
        """Whether the loss has a graph and ``param`` (a leaf, or the parameter an alias stands for) is not in it."""
        return self.ready() and id(param) not in self._accumulators

    def path_from_parameter(self, param, batch_size):
        if not self.ready() or id(param) not in self._accumulators:
            return None
        found = broadcast.plan(self._users, (self._accumulators[id(param)], 0), param.shape, batch_size)
        return None if found is None else (found, param.shape, batch_size)

    def broadcast_into_batch(self, tensor, batch_size):
        if tensor.grad_fn is None:
            return False
        return broadcast.broadcast_into_batch(self._users, (tensor.grad_fn, tensor.output_nr), tensor.shape, batch_size)

    def path_from_tensor(self, tensor, batch_size):
        if not self.ready() or tensor.grad_fn is None:
            return None
        found = broadcast.plan(self._users, (tensor.grad_fn, tensor.output_nr), tensor.shape, batch_size)
        return None if found is None else (found, tensor.shape, batch_size)


def pass_inputs(state, params):
    """What a backward pass must reach for the hooks of ``state`` to fire: the output tensors (as
    gradient edges) of the calls whose rules read their output gradients, and the parameters of the
    other hooked paths (attention projections, shared tensors), whose hooks sit on nodes below."""
    from torch.autograd.graph import GradientEdge

    edges = [GradientEdge(leaf.grad_fn, leaf.output_nr) for call in state.calls for leaf in call.leaves
             if leaf.grad_fn is not None]
    return edges + [params[index] for index in sorted(state.hooked)]


def no_batch_axis(tensor, batch_size):
    return batch_size > 1 and batch_size not in tuple(tensor.shape)


def as_if_batched(call, batch_size, delta=None):
    """A call whose output all samples share, as if every sample had made it: its inputs and
    output gain a leading batch axis, and ``delta`` (``[B, *output shape]``, the samples'
    output gradients) is its output gradient."""
    shared = call.leaves[0]
    virtual = Call(
        call.module, call.name,
        tuple(_expand(a, batch_size) for a in call.args),
        {k: _expand(v, batch_size) for k, v in call.kwargs.items()},
        call.start, call.end, buffers_before=call.buffers_before, buffers=call.buffers,
    )
    virtual.leaves = [dataclasses.replace(shared, grad_fn=None, shape=torch.Size((batch_size, *shared.shape)))]
    virtual.leaf_positions = [0]
    if delta is not None:
        virtual.grads = {0: delta}
    return virtual


def release(call):
    """Drop a call's references to its inputs and output gradients (activations that autograd
    frees during the backward pass would otherwise live until the step ends)."""
    call.args, call.kwargs, call.grads, call.leaves = (), {}, {}, []


def _expand(value, batch_size):
    if torch.is_tensor(value):
        return value.expand(batch_size, *value.shape)
    return value


def nan_where_failed(results, failed):
    """A parameter one of whose uses failed in some backward pass: all its values NaN (never the sum of the rest)."""
    for index in failed & results.keys():
        results[index] = {k: nan_like(v) for k, v in results[index].items()}


def nan_like(value):
    if torch.is_tensor(value):
        return torch.full_like(value, float("nan"), dtype=value.dtype if value.is_floating_point() else torch.float64)
    if isinstance(value, tuple):
        return tuple(nan_like(v) for v in value)
    return value
