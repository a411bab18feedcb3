"""Statistics of the global batch under ``torch.distributed`` (``DistributedDataParallel``).

Each rank sees its shard of ``B_r`` samples; the optimizer uses DDP's average of the
ranks' gradients, ``g = (1/W) Σ_r g_r``. With ``L_r = Σ_{n∈r} c_n`` the rank's loss, the
samples' terms of the loss DDP effectively minimises are ``c_n / W``, so the global
individual gradient is ``g̃_n = B · ∇(c_n / W) = (B / W) · grad_batch[n]`` with
``B = Σ_r B_r``, and ``g = mean_n g̃_n`` again. (With equal shards ``B / W = B_r``: the
local scale. With unequal shards DDP weights the ranks' samples differently unless
the loss is scaled, e.g. ``loss = loss_sum / B · W``; the statistics describe what
the optimizer gets either way.)

A tracked step costs three collectives (more at some steps), each packing everything of its kind:

1. inside the engine, after the backward pass: one ``all_reduce`` of every
   parameter's gradient of this backward pass (as the rules formed it) and the shard
   sizes, giving ``g`` and ``B`` to the transforms that need them (``g̃_nᵀ g``, α's
   predicted update);
2. one ``all_reduce`` of every additive result (``Σ_n g̃_n²``, histogram counts, the loss);
3. one ``all_gather`` of every per-sample result (``‖g̃_n‖²``, ``g̃_nᵀ g``, slopes,
   individual losses), padded to the largest shard;
4. only at a step whose results are maxima over samples (``Transform.summed_over_ranks`` false:
   the largest individual-gradient element a histogram's range adapts to), one ``all_gather`` of
   them, and each transform's ``combine`` of the ranks' values;
5. at a start step of ``Alpha``, one ``all_gather`` in the optimizer's step post-hook: the slopes of
   the individual gradients it kept until the update was known (``Alpha._gather_kept``);
6. with the diagnosis on, the signals' gathers at the steps they record (``ActivationStats``,
   ``InputStats``: their parts of the batch; ``NonfiniteOrigin``: where each rank first saw a
   non-finite loss since the last tracked step).

Only rank 0 keeps the record, writes the log and diagnoses.
"""

import functools
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist

from cockpit_lite.utils.shards import is_sharded


class Group:
    """The ranks whose batches are one, as the Cockpit uses them: those of the process group of the
    ``DistributedDataParallel`` module given to it (the default group unless DDP was given another, as
    data parallelism within a larger job is), or of the default group for parameters given alone."""

    sharded = False
    """Whether the parameters are sharded over the ranks (FSDP2: ``cockpit_lite.sharded.ShardedGroup``)."""
    precision = None  # the flag of every tracked step under FSDP2's mixed precision, or None
    held = None  # every rank's number of samples of a subsample (FSDP2, ``Cockpit(samples=k)``), or None
    ddp = None  # the ``DistributedDataParallel`` module given to the Cockpit, or None

    def __init__(self, ddp=None):
        self.ddp = ddp
        self.process_group = None if ddp is None else ddp.process_group  # (None: the default one)
        self.world = dist.get_world_size(self.process_group)
        self.rank = dist.get_rank(self.process_group)  # (the rank in the group: the first keeps the record)

    @property
    def main(self):
        return self.rank == 0

    @contextmanager
    def own_passes(self, model, params, whole):
        """The Cockpit's own backward passes through the step's graph, before the user's (Hessian-vector
        products, the GGN's pseudo-loss passes, the engine's global path): yields the tensors of the graph
        that stand for ``params`` (``leaves``; FSDP2 keeps its parameters for them, ``ShardedGroup.own_passes``).

        DDP with ``static_graph=True`` queues its reduction of the first step's gradients from the backward
        pass of its output's autograd node, once: a pass of the Cockpit's would take that turn, and the
        user's backward pass would leave the gradients unreduced (the ranks' parameters then differ). DDP
        is told that it is queued already while these passes run."""
        queued = getattr(self.ddp, "_static_graph_delay_allreduce_enqueued", None)
        if queued is not None:
            self.ddp._static_graph_delay_allreduce_enqueued = True
        try:
            yield self.leaves(model, params)
        finally:
            if queued is not None:
                self.ddp._static_graph_delay_allreduce_enqueued = queued

    def mean(self, tensors):
        """``(1/W) Σ_r`` of every rank's ``tensors`` (one all-reduce on their device, in float32 or wider;
        every rank gets the same values): a Hessian-vector product of the loss the ranks minimise,
        whose Hessian is the mean of the ranks'."""
        tensors = list(tensors)
        dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors], torch.float32)
        flat = torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors])
        dist.all_reduce(flat, group=self.process_group)
        flat /= self.world
        return [part.reshape(t.shape).to(t.dtype) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]

    def stand_ins(self, model):
        """``(tensor of the graph, tracked parameter)`` pairs of the parameters that the model's forward
        pass and its graph hold in place of the tracked ones (FSDP2's unsharded ones; none under DDP)."""
        return []

    def unsharded(self, model):
        """``{id(tensor of the graph): tracked parameter}`` of ``stand_ins``."""
        return {id(stand_in): param for stand_in, param in self.stand_ins(model)}

    def leaves(self, model, params):
        """The tensors of the graph to differentiate by for ``params`` (each, or its stand-in)."""
        stand_ins = {id(param): stand_in for stand_in, param in self.stand_ins(model)}
        return [stand_ins.get(id(p), p) for p in params]

    def sum_and_sizes(self, tensors, local_size):
        """All-reduce (sum) ``tensors`` and gather every rank's ``local_size`` in one collective.

        Returns ``(summed tensors, [B_0, ..., B_{W-1}])``.
        """
        sizes = torch.zeros(self.world, dtype=torch.float64)
        sizes[self.rank] = local_size
        summed = self.sum([sizes] + list(tensors))
        return summed[1:], [int(s) for s in summed[0]]

    def sum(self, tensors):
        """All-reduce (sum) a list of tensors in one packed float64 collective."""
        tensors = list(tensors)
        if not tensors:
            return []
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64).cpu() for t in tensors])
        flat = flat.to(_device())
        dist.all_reduce(flat, group=self.process_group)
        flat = flat.cpu()
        out, offset = [], 0
        for t in tensors:
            n = t.numel()
            out.append(flat[offset:offset + n].reshape(t.shape).to(t.dtype).to(t.device))
            offset += n
        return out

    def each(self, tensors):
        """Every rank's ``tensors`` (of the same shapes on every rank), in one collective: for each
        tensor, the list of the ranks' values in rank order."""
        tensors = list(tensors)
        if not tensors:
            return []
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
        ranks = self.gather([flat], [flat.numel()] * self.world)[0].split(flat.numel())
        sizes = [t.numel() for t in tensors]
        out = [[] for _ in tensors]
        for rank in ranks:
            for values, part, t in zip(out, rank.split(sizes), tensors):
                values.append(part.reshape(t.shape).to(t.dtype).to(t.device))
        return out

    def gather(self, tensors, sizes):
        """Concatenate per-sample vectors (``[B_r]`` each) over the ranks in rank order, in one collective."""
        tensors = list(tensors)
        if not tensors:
            return []
        longest = max(sizes)
        local = torch.zeros(len(tensors), longest, dtype=torch.float64)
        for row, t in enumerate(tensors):
            local[row, : t.numel()] = t.detach().reshape(-1).to(torch.float64).cpu()
        parts = [torch.empty_like(local).to(_device()) for _ in range(self.world)]
        dist.all_gather(parts, local.to(_device()), group=self.process_group)
        out = []
        for row, t in enumerate(tensors):
            values = torch.cat([part[row, :size].cpu() for part, size in zip(parts, sizes)])
            out.append(values.to(t.dtype).to(t.device))
        return out


def gather_objects(obj, group=None):
    """Every rank's ``obj`` (dicts, lists and tuples of tensors and plain values), in rank order
    (``dist.all_gather_object``), the tensors on the CPU. Each tensor travels as a NumPy array: pickling
    torch tensors costs far more (12 small ones, a round trip: 4.3 ms, against 0.12 ms
    for their NumPy arrays), and the diagnosis's signals gather theirs at every recorded step."""
    from torch.utils import _pytree as pytree

    packed = pytree.tree_map(lambda leaf: _Array.of(leaf) if torch.is_tensor(leaf) else leaf, obj)
    ranks = [None] * dist.get_world_size(group)
    dist.all_gather_object(ranks, packed, group=group)
    return [pytree.tree_map(lambda leaf: leaf.tensor() if isinstance(leaf, _Array) else leaf, rank) for rank in ranks]


class _Array:
    """A tensor in transit (``gather_objects``): a NumPy array of its values, or of their bits as integers of
    the same width where NumPy has no such dtype (bfloat16, float8)."""

    BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def __init__(self, array, dtype):
        self.array, self.dtype = array, dtype

    @classmethod
    def of(cls, tensor):
        tensor = tensor.detach().cpu()
        try:
            return cls(tensor.numpy(), None)
        except TypeError:
            return cls(tensor.view(cls.BITS[tensor.element_size()]).numpy(), tensor.dtype)

    def tensor(self):
        tensor = torch.from_numpy(self.array.copy())
        return tensor if self.dtype is None else tensor.view(self.dtype)


def _device():
    """Where collectives of the default backend run (NCCL needs CUDA tensors)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_for(model, params=()):
    """The ``Group`` of a DDP run, the ``ShardedGroup`` of a model sharded by FSDP2
    (``cockpit_lite.sharded``), ``None`` without either.

    Raises:
        ValueError: naming the fix, if a process group is initialised and the model is a
            module not wrapped in ``DistributedDataParallel`` nor sharded by FSDP2 (its
            gradients would not be averaged, and the statistics would describe one shard);
            for FSDP1 (``FullyShardedDataParallel``), for parameters sharded otherwise than by
            ``fully_shard`` (tensor parallel), and for the parameters of a sharded model given
            without it.
    """
    from cockpit_lite import sharded

    initialised = dist.is_available() and dist.is_initialized()
    if model is None and any(is_sharded(p) for p in params):
        raise ValueError(
            "the parameters given to the Cockpit are sharded (DTensors of FSDP2 or tensor parallel); their "
            "individual gradients come from the model's layers. Fix: pass the model, Cockpit(model, ...)"
        )
    if not initialised:
        return None
    if model is None:
        return Group() if dist.get_world_size() > 1 else None
    flattened = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if flattened is not None and any(isinstance(m, flattened.FullyShardedDataParallel) for m in model.modules()):
        raise ValueError(
            "the model is wrapped in FullyShardedDataParallel (FSDP1), whose flattened parameters "
            "cockpit-lite cannot map to the layers. Fix: shard it with FSDP2 instead: from "
            "torch.distributed.fsdp import fully_shard; fully_shard(layer) for each layer, then "
            "fully_shard(model) (Lightning: ModelParallelStrategy with fully_shard in configure_model; "
            "Accelerate: FullyShardedDataParallelPlugin(fsdp_version=2))"
        )
    if sharded.is_fsdp2(model) or any(is_sharded(p) for p in model.parameters()):
        return sharded.group_for_sharded(model)
    wrapped = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    if not wrapped and dist.get_world_size() > 1:
        raise ValueError(
            "a torch.distributed process group is initialised but the model given to the "
            "Cockpit is neither wrapped in DistributedDataParallel nor sharded by FSDP2. Fix: "
            "model = torch.nn.parallel.DistributedDataParallel(model) and pass that wrapped "
            "model to the Cockpit, or shard it with torch.distributed.fsdp.fully_shard (each "
            "layer, then the model) and pass the model (or destroy the process group for a "
            "single-process run)."
        )
    if wrapped:  # (a DDP group of one process is one process)
        return Group(model) if dist.get_world_size(model.process_group) > 1 else None
    return None


def reduce_results(group, results, transforms, sizes, extra_sums=(), extra_per_sample=(), held=None):
    """Combine every rank's transform results into those of the global batch (collectives 2 and 3).

    Args:
        results: ``{index: {key: value}}`` of this rank.
        transforms: the step's transforms (their ``per_sample_output`` and ``summed_over_ranks`` say
            how to combine: gathered, summed, or the ranks' values gathered and ``combine``d; a value
            of ``from_grad_only`` or sharded over the ranks, FSDP2's, is global already).
        sizes: every rank's number of samples.
        extra_sums, extra_per_sample: more tensors to sum / gather in the same collectives.
        held: every rank's number of samples of the transforms' per-sample results, if not ``sizes``
            (a subsample's: then they are gathered apart from ``extra_per_sample``).

    Returns:
        ``(results, summed extras, gathered extras)``.
    """
    by_key = {t.key: t for t in transforms}
    sums, gathers, places, eaches = list(extra_sums), list(extra_per_sample), [], []
    combined = {index: {} for index in results}
    for index in sorted(results):
        for key, value in results[index].items():
            parts = value if isinstance(value, tuple) else (value,)
            if by_key[key].from_grad_only or is_sharded(parts[0]):
                combined[index][key] = value
                continue
            if not (by_key[key].per_sample_output or by_key[key].summed_over_ranks):
                eaches.append((index, key, value))
                continue
            kind = "gather" if by_key[key].per_sample_output else "sum"
            target = gathers if kind == "gather" else sums
            places.append((index, key, kind, len(target), len(parts), isinstance(value, tuple)))
            target.extend(parts)
    summed = group.sum(sums)
    extras = len(extra_per_sample)
    if held is None or list(held) == list(sizes):
        gathered = group.gather(gathers, sizes)
    else:
        gathered = group.gather(gathers[:extras], sizes) + group.gather(gathers[extras:], held)
    for (index, key, _), values in zip(eaches, group.each([value for _, _, value in eaches])):
        combined[index][key] = by_key[key].combine(values)
    for index, key, kind, start, count, is_tuple in places:
        source = gathered if kind == "gather" else summed
        parts = source[start:start + count]
        combined[index][key] = tuple(parts) if is_tuple else parts[0]
    return combined, summed[: len(extra_sums)], gathered[:extras]
