"""Statistics of the global batch on a model sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``).

FSDP2 keeps each parameter as a ``DTensor``: rank ``s`` holds the rows ``[s·c, (s+1)·c)`` of its
first axis (``c = ⌈n₀ / W⌉``, ``W`` ranks; the last ranks' rows may be fewer or none). Around a
module's forward and backward pass it all-gathers the whole (unsharded) parameters, and after the
backward pass it reduce-scatters their gradients, so that rank ``s`` holds its rows of the mean
of the ranks' gradients, ``g = (1/W) Σ_r G_r`` (``G_r = Σ_{n∈r} grad_batch[n]``, rank r's
gradient of its loss). As under DDP (``cockpit_lite.distributed``) the global individual gradient
is ``g̃_n = (B / W) · grad_batch[n]`` with ``B = Σ_r B_r``, and ``g = mean_n g̃_n``.

The individual gradients of a layer exist only during its backward pass (the rules form them from
the layer's inputs and output gradient, of the whole parameter): the transforms run right there,
so that a rank never holds more than one layer's, and what they leave is small or sharded.
Per parameter, at that moment (``ShardedGroup.run``):

1. the transforms whose value has the parameter's shape and adds over samples
   (``Transform.elementwise``: ``Σ_n g̃_n``, ``Σ_n g̃_n²``) run on the rank's samples;
2. one reduce-scatter of ``G_r / W`` and those values (in float32 or wider) gives this rank's rows of ``g`` and
   of their sums over all samples: kept as DTensors sharded as the parameter;
3. one all-gather of the rows of ``g`` gives the whole ``g`` for a moment (the size of the
   all-gather FSDP makes of the parameter itself): the per-sample values that project on it
   (``g̃_nᵀ g``, α's slopes) run on the rank's samples, with ``B / W`` as the scale;
4. the individual gradients are dropped.

After the backward pass, as under DDP, one all-reduce adds the additive results (histogram
counts, the loss) and one all-gather concatenates the per-sample results (``[B_r]`` each) in rank
order; a result that is a ``DTensor`` or depends on ``g`` alone (``Transform.from_grad_only``) is
global already. The quantities then compute from DTensors (parameters, gradients, those
sums): elementwise arithmetic stays on each rank, and every sum over elements goes through
``cockpit_lite.utils.norms`` / ``cockpit_lite.utils.shards``, which add the ranks' partial sums.
Every rank runs every quantity (their collectives must match); rank 0 keeps the record.

The curvature comes from the Cockpit's own backward passes through the step's graph, before the
user's (``ShardedGroup.own_passes``: FSDP2 reduces no gradient in them and is left as the forward pass
left it):

- Hessian-vector products (``HessMaxEV``, Hutchinson's ``HessTrace``) differentiate the gradient's
  graph a second time, which reads every layer's unsharded parameters: they are gathered once and
  kept whole while the products run (FSDP2 would free a layer's after its backward pass: "setStorage
  ... out of bounds for storage of size 0"). Every rank forms ``H_r v`` of its loss with the same
  vectors (the Cockpit's generators, seeded alike), and one all-reduce per product gives every rank
  ``Hv = (1/W) Σ_r H_r v`` (``cockpit_lite.curvature.hvp``); the ranks' eigensolvers and estimators
  run in step on equal numbers. Hutchinson's estimate keeps each rank's rows of its draws, sharded
  as the parameter (``cockpit_lite.curvature.jackknife``).
- The engine's GGN diagonal (``cockpit_lite.curvature.ggn``): each pseudo-loss pass runs through the
  layers' backward passes as the user's does (FSDP2 gathering each layer's parameters there), and its
  ``Σ_n g̃_n²`` is reduce-scattered in ``run``: the diagonal is sharded as the parameter.

Not computed under FSDP (NaN with a flag naming the reason and the fix): BackPACK's extensions
(they do not know FSDP's modules), values per sample and element of a whole parameter (``TICDiag``
at a subsampled step; ``Transform.shardable``), and individual gradients that need the exact global
path (a parameter used before a layer that mixes the samples, BatchNorm in training mode; a module
that draws random numbers): that path differentiates every sample's loss through FSDP's own hooks.
"""

import functools
import math
from contextlib import contextmanager

import torch
import torch.distributed as dist

from cockpit_lite import distributed as _distributed
from cockpit_lite.engine import transforms as _transforms
from cockpit_lite.utils.shards import gathering

UNSUPPORTED_BACKPACK = (
    "not computed on a model sharded by FSDP2: it needs BackPACK's extensions, which do not know FSDP2's "
    "modules nor its sharded parameters. NaN at every step. Fix: a curvature the Cockpit computes itself "
    "(curvature='auto': Hutchinson's estimate for HessTrace, the engine's exact GGN diagonal for the TICs), "
    "or BackPACK's in a run without sharding"
)
"""The reason a quantity that needs BackPACK's extensions gives under FSDP2."""

UNSHARDABLE = (
    "not computed on a model sharded by FSDP2 at this step: it needs {keys}, a value per sample and per "
    "element of each whole parameter (at a subsampled step of Cockpit(samples=k): TICDiag's estimate), for "
    "which the sharding has no layout (a rank holds rows of the parameters, not of the samples). NaN at such "
    "steps. Fix: Cockpit(samples=None) for its exact value (TICTrace's subsampled estimate needs per-sample "
    "norms only)"
)
"""The reason of a quantity that needs a transform that is not ``shardable``, under FSDP2."""

GLOBAL_PATH = (
    "its individual gradients need the exact global path (it is used before a layer that mixes the "
    "samples, such as BatchNorm in training mode, or in a module that draws random numbers), which "
    "differentiates every sample's loss through the graph and FSDP2's own hooks: not done on a sharded "
    "model. Fix: BatchNorm in eval mode or a per-sample normalisation (LayerNorm, GroupNorm), no "
    "dropout inside the module, or track this parameter in a run without sharding"
)
"""Why such a parameter's values are NaN under FSDP2."""


def fsdp_params(model):
    """FSDP2's records of the parameters it manages in ``model`` (``FSDPParam`` objects)."""
    for group in fsdp_groups(model):
        yield from group.fsdp_params


def is_fsdp2(model):
    """Whether ``model`` (a module) has a submodule sharded by ``fully_shard``."""
    if not dist.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())


def fsdp_states(model):
    """FSDP2's states of the modules of ``model`` that are ``fully_shard``-ed."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            yield module._get_fsdp_state()


def fsdp_groups(model):
    """FSDP2's parameter groups in ``model`` (one per ``fully_shard`` call)."""
    for state in fsdp_states(model):
        yield from state._fsdp_param_groups


def precision_flag(model):
    """The flag of every tracked step of a model sharded with FSDP2's mixed precision
    (``MixedPrecisionPolicy(param_dtype=...)`` of a narrower dtype than the parameters'), or ``None``."""
    narrower = sorted({str(group.mp_policy.param_dtype) for group in fsdp_groups(model)
                       for record in group.fsdp_params
                       if group.mp_policy.param_dtype is not None
                       and group.mp_policy.param_dtype.itemsize < record.sharded_param.dtype.itemsize})
    if not narrower:
        return None
    return (
        f"FSDP2 mixed precision (param_dtype={', '.join(narrower)}): every statistic is of the forward and "
        "backward passes in that dtype, its individual gradients summed in float32 or wider; the optimizer "
        "steps with FSDP2's reduction of the low-precision gradients, which differs from that sum by the "
        "low precision's rounding (2^-8 relative for bfloat16): GradNorm is of the optimizer's gradient, the "
        "others of the float32 sum, and Alpha is NaN wherever the real update is off the line predicted from "
        "that sum. Fix: MixedPrecisionPolicy(param_dtype=None) (the parameters' own dtype) on the tracked "
        "runs for the statistics of the full-precision step"
    )


def group_for_sharded(model):
    """The ``ShardedGroup`` of a model sharded by FSDP2.

    Raises:
        ValueError: naming the fix, for parameters sharded otherwise than FSDP2 does (tensor
            parallel, a mesh of several dimensions as in HSDP), on several meshes, or left
            unsharded by a process group of several ranks (their gradients would not be
            averaged over the ranks).
    """
    from torch.distributed.tensor import DTensor, Shard

    mesh, plain, other = None, [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if not isinstance(param, DTensor):
            plain.append(name)
            continue
        if param.device_mesh.ndim != 1 or tuple(param.placements) != (Shard(0),):
            other.append(f"{name} ({param.device_mesh.ndim}-d mesh, {tuple(param.placements)})")
            continue
        if mesh is None:
            mesh = param.device_mesh
        elif param.device_mesh != mesh:
            other.append(f"{name} (another device mesh)")
    if other:
        raise ValueError(
            f"cockpit-lite supports parameters sharded by FSDP2 along their first axis on one 1-d device "
            f"mesh (fully_shard); these are sharded otherwise: {', '.join(other[:4])}"
            f"{'...' if len(other) > 4 else ''} (tensor parallel, HSDP's 2-d mesh, or another mesh). "
            "Fix: shard the model with fully_shard(module) over one 1-d mesh of all ranks (the default "
            "mesh), without tensor parallelism, for the tracked runs"
        )
    if not is_fsdp2(model):
        raise ValueError(
            "the model's parameters are DTensors, but no module of it is sharded by fully_shard (FSDP2), "
            "whose gradient averaging the statistics rely on. Fix: shard the model with "
            "torch.distributed.fsdp.fully_shard (each layer, then the model), without tensor parallelism"
        )
    if plain and dist.get_world_size() > 1:
        raise ValueError(
            f"the model is sharded by FSDP2 (fully_shard) but {len(plain)} trainable parameter(s) are not: "
            f"{', '.join(plain[:4])}{'...' if len(plain) > 4 else ''}; nothing averages their gradients "
            "over the ranks. Fix: fully_shard the root module too, fully_shard(model), after its layers"
        )
    return ShardedGroup(mesh, precision_flag(model))


class ShardedGroup(_distributed.Group):
    """The ranks of a model sharded by FSDP2: the collectives of ``Group`` on the mesh's process
    group, and the per-parameter step of the module docstring (``run``)."""

    sharded = True
    GLOBAL_PATH = GLOBAL_PATH

    def __init__(self, mesh, precision=None):
        self.mesh = mesh
        self.precision = precision  # the flag of every step under FSDP2's mixed precision, or None
        self.process_group = mesh.get_group()
        self.world = mesh.size()
        self.rank = dist.get_rank(self.process_group)
        self.sizes = None  # every rank's number of samples at the current step (``batch_sizes``)

    # -- the step's batch ------------------------------------------------------------------

    def batch_sizes(self, local_size):
        """Every rank's number of samples (one all-gather), kept in ``sizes`` for the step."""
        sizes = torch.zeros(self.world, dtype=torch.float64)
        sizes[self.rank] = local_size
        self.sizes = [int(s) for s in self.sum([sizes])[0]]
        self.held = None
        return self.sizes

    @property
    def scale(self):
        """``B / W``: ``g̃_n = (B / W) · grad_batch[n]``."""
        return sum(self.sizes) / self.world

    def subset_of(self, subset):
        """This rank's part of a subsample ``subset`` (sorted indices into the global batch), as
        indices into its own samples; every rank's number of them in ``held``."""
        starts = [sum(self.sizes[:r]) for r in range(self.world + 1)]
        self.held = [int(((subset >= starts[r]) & (subset < starts[r + 1])).sum()) for r in range(self.world)]
        mine = subset[(subset >= starts[self.rank]) & (subset < starts[self.rank + 1])]
        return mine - starts[self.rank]

    # -- the graph: FSDP's unsharded parameters stand for the tracked ones ------------------

    def stand_ins(self, model):
        """``(unsharded parameter, tracked parameter)`` pairs of the FSDP2-managed parameters (once
        FSDP2 has gathered them: after the first forward pass): the autograd graph of a forward pass
        holds FSDP's unsharded parameters, not the sharded ones, and a module whose parameters stay
        unsharded after its forward pass (the root's) holds them."""
        return [(record._unsharded_param, record.sharded_param)
                for record in fsdp_params(model) if hasattr(record, "_unsharded_param")]

    @contextmanager
    def own_passes(self, model, params, whole):
        """The Cockpit's own backward passes through the step's graph, before the user's: yields the
        graph's leaves of ``params`` (FSDP's unsharded parameters) to differentiate by.

        FSDP2's hooks fire in these passes as in the user's: each module's pre-backward hook gathers
        its parameters (a no-op when they are whole), its post-backward hook reshards them and
        reduce-scatters the ``.grad`` of its unsharded parameters (``autograd.grad`` leaves ``.grad``
        alone). Inside, FSDP2 reduces no gradient (``requires_gradient_sync`` off: nothing of these
        passes reaches the optimizer's gradients), and the parameters that are whole now (the
        root's) stay whole; with ``whole``, every parameter is gathered first and stays whole (a
        Hessian-vector product differentiates the gradient's graph, which reads the unsharded
        parameters of every layer, and FSDP2 frees them after a layer's backward pass: "setStorage
        ... out of bounds for storage of size 0"). On exit FSDP2 is as the forward pass left it for
        the user's backward pass: the same parameters sharded, the same settings, the same order of
        backward prefetching (the passes consume it), so that the user's gradients and FSDP2's
        reduce-scatter of them are those of a step without the Cockpit.
        """
        groups = list(fsdp_groups(model))
        contexts = {id(state._state_ctx): state._state_ctx for state in fsdp_states(model)}  # (one per root)
        before = [(g.is_unsharded, g.reshard_after_backward, g.reduce_grads, list(g._post_forward_indices))
                  for g in groups]
        last = {key: context.is_last_backward for key, context in contexts.items()}
        try:
            for context in contexts.values():
                context.is_last_backward = False  # (else the passes' end clears the prefetch order)
            for group, (unsharded, *_) in zip(groups, before):
                if whole and not unsharded:
                    group.unshard()
                    group.wait_for_unshard()
                group.reshard_after_backward = not (whole or unsharded)
                group.reduce_grads = False
            yield self.leaves(model, params)
        finally:
            for group, (unsharded, reshard, reduce, order) in zip(groups, before):
                group.reshard_after_backward, group.reduce_grads = reshard, reduce
                group._post_forward_indices[:] = order
                if not unsharded:
                    group.reshard()
            for key, context in contexts.items():
                context.is_last_backward = last[key]

    # -- one parameter, in its layer's backward pass ---------------------------------------

    def run(self, transforms, per_sample, batch=None, scratch=None):
        """The transforms' values of one parameter's individual gradients (this rank's samples, of
        the whole parameter), and this rank's rows of ``g`` (flat, to check against FSDP's
        gradient). See the module docstring; two collectives (one without a transform that projects on ``g``)."""
        param = per_sample.param
        per_sample.batch_size = self.scale
        elementwise = [t for t in transforms if t.elementwise]
        others = [t for t in transforms if not t.elementwise]
        values = _transforms.run(elementwise, per_sample, None, scratch) if elementwise else {}
        # G_r (the rank's samples' sum, the chunks' if chunked) and the values: dropped once reduced, before
        # the other transforms take their memory (each the whole parameter's size)
        dtypes = {t.key: values[t.key].dtype for t in elementwise}
        rows = self.reduce_scatter([per_sample.grad] + [values.pop(t.key) for t in elementwise], param,
                                   divide=self.world)
        results = {}
        if others:  # (the GGN's passes: SumGradSquared alone, no projection on g)
            per_sample.grad = self.all_gather(rows[0], param).reshape(-1).to(per_sample.dtype)
            with gathering():  # a direction or the parameter, gathered on the first chunk of samples only
                results = _transforms.run(others, per_sample, batch, scratch)
        for transform, part in zip(elementwise, rows[1:]):
            results[transform.key] = self.shard(part.to(dtypes[transform.key]), param)
        return results, rows[0].reshape(-1)

    def shard(self, rows, param):
        """``rows`` (this rank's rows of a tensor of ``param``'s shape) as a ``DTensor`` sharded as ``param``."""
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(rows, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())

    def _rows(self, param):
        """``(c, this rank's first row, its number of rows)`` of ``param``'s first axis."""
        first = param.shape[0]
        chunk = math.ceil(first / self.world)
        start = min(self.rank * chunk, first)
        return chunk, start, min(chunk, first - start)

    def reduce_scatter(self, tensors, param, divide=None):
        """``tensors`` (each of ``param``'s shape or numel) summed over the ranks, this rank's rows of
        each (``param``'s sharding), in one reduce-scatter, in float32 or wider (float64 for float64);
        with ``divide``, the first tensor divided by it (in the collective's buffer: no copy of its own)."""
        chunk, _, count = self._rows(param)
        first = param.shape[0]
        widths = [t.numel() // first for t in tensors]
        dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors], torch.float32)
        padded = tensors[0].new_zeros((self.world * chunk, sum(widths)), dtype=dtype)  # rank s: rows [s·c, (s+1)·c)
        offset = 0
        for number, (tensor, width) in enumerate(zip(tensors, widths)):
            part = padded[:first, offset:offset + width]
            part.copy_(tensor.detach().reshape(first, width))
            if number == 0 and divide is not None:
                part.div_(divide)
            offset += width
        out = padded.new_empty((chunk, sum(widths)))
        dist.reduce_scatter_single(out.reshape(-1), padded.reshape(-1), group=self.process_group)
        return [part[:count].reshape(count, *param.shape[1:])
                for part in out.split(widths, dim=1)]

    def all_gather(self, rows, param):
        """The whole tensor of ``param``'s shape from every rank's ``rows`` (one all-gather)."""
        chunk, _, count = self._rows(param)
        padded = rows.new_zeros((chunk, *param.shape[1:]))
        padded[:count] = rows
        out = padded.new_empty((chunk * self.world, *param.shape[1:]))
        dist.all_gather_single(out, padded, group=self.process_group)
        return out[: param.shape[0]]

    def check_norms(self, norms, errors):
        """``cockpit_lite.engine.check``'s norms of this rank's rows, squared and added over the ranks (one all-reduce):
        every rank decides alike."""
        squares = torch.tensor([norms, errors], dtype=torch.float64) ** 2
        return self.sum([squares])[0].sqrt().tolist()
