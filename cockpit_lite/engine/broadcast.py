"""Per-sample gradients of tensors that every sample shares: broadcast into the batch.

A learned positional table (``x + self.pos[:T]``, or ``self.pos_emb(torch.arange(T))``),
a class token (``self.cls.expand(B, -1, -1)``) or a learned scale has no batch axis of
its own: the batch appears at the first operation that combines it with batched data
(the *batch node* of the autograd graph). Sample n's gradient w.r.t. the shared tensor
is that node's backward applied to sample n's part of the node's output gradient,
carried back through the shape-only operations in between (slices, views, unsqueezes).

``plan`` finds the path in the graph before the backward pass (the forward output
shape of every node is in its input metadata); ``Path`` registers a pre-hook on the
batch node and computes the per-sample gradients there, during the user's backward
pass, while the nodes on the path still hold their saved tensors. An addition (the
common case) is vectorised; any other batch node is called once per sample.
"""

import functools

import torch

MAX_DEPTH = 8
"""Nodes followed from the shared tensor before giving up (the global path takes over)."""
MAX_PATHS = 64
"""Paths from one shared tensor to the batch nodes (each computes its part per sample), beyond which the
global path takes over."""


def consumers(root):
    """``{(node, output index): [(consumer node, its input position), ...]}`` of the graph below ``root``."""
    users, seen, stack = {}, {root}, [root]
    while stack:
        node = stack.pop()
        for position, (child, index) in enumerate(node.next_functions):
            if child is None:
                continue
            users.setdefault((child, index), []).append((node, position))
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return users


def accumulators(users):
    """``{id(parameter): its AccumulateGrad node}`` among the graph's nodes."""
    found = {}
    for node, _ in users:
        variable = getattr(node, "variable", None)
        if variable is not None:
            found[id(variable)] = node
    return found


def _batch_axis(node, shape, out, batch_size):
    """The axis of a node's output ``out`` that indexes the samples: its first axis of size
    ``batch_size``; for an elementwise node (``ELEMENTWISE``), the first one that its input of
    ``shape`` (aligned to the right, as broadcasting aligns them) does not have already. ``None``
    if there is none: a ``[B, D]`` table scaled before it meets the batch is as long as the batch
    by chance, and no sample is in it yet."""
    elementwise = type(node).__name__ in ELEMENTWISE
    aligned = (None,) * (len(out) - len(shape)) + tuple(shape)[max(len(shape) - len(out), 0):]
    for axis, (size, before) in enumerate(zip(out, aligned)):
        if size == batch_size and not (elementwise and before == batch_size):
            return axis
    return None


ELEMENTWISE = {"AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0", "ExpandBackward0", "WhereBackward0",
               "MaskedFillBackward0"}
"""Nodes whose output axes line up with their inputs' (broadcasting): an axis of size B that the
input has is the input's own, not the batch."""


SHAPE_ONLY = {
    "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "UnsqueezeBackward0",
    "SqueezeBackward0", "SqueezeBackward1", "SliceBackward0", "SelectBackward0", "TBackward0",
    "TransposeBackward0", "PermuteBackward0", "CloneBackward0", "ToCopyBackward0",
}
"""Nodes that only move or cast elements (they never bring the batch in)."""

INDEXING = {"IndexBackward0", "IndexSelectBackward0", "GatherBackward0", "EmbeddingBackward0", "TakeBackward0"}
"""Nodes that pick elements of the tensor by an index (a relative-position bias table read at
``index[T, T]``, positions ``pos[arange(T)]``): their output's axes are the index's, and the
batch comes in there only through a batched index. An output without an axis of size ``B`` is
carried back like a shape-only node's; one with such an axis cannot tell a batched index from
an index as long as the batch (``T = B``): no path."""


def plan(users, start, shape, batch_size):
    """The paths from ``start = (node, output index)``, a tensor of ``shape``, down to the batch
    nodes, or ``None``.

    A path is a list of ``(node, input position)`` from a consumer of the tensor to a batch
    node: the first node that is not shape-only (``SHAPE_ONLY``), nor an elementwise one that
    leaves the shape as it is (``ELEMENTWISE``: a causal mask applied with ``torch.where``, as
    T5's decoder applies it to its position bias; no sample comes in there, and each sample's
    gradient is carried back through its backward as through a shape-only node's), nor an
    indexing one without an axis of size ``batch_size`` (``INDEXING``), whose output must have
    such an axis (``_batch_axis``). Every node on the way must have a single output. A tensor
    on the way with several consumers (T5's position bias, computed once and added to the
    scores of every layer) has a path through each, and sample n's gradient is the sum of theirs
    (at most ``MAX_PATHS``). A shape-only node whose output gains an axis of size ``batch_size``
    unfolds a batch that the tensor held folded (``[2B, C]`` viewed as ``[B, 2C]``): the
    tensor is not shared, and there is no path.
    """
    found = _paths(users, start, tuple(shape), batch_size, [], MAX_DEPTH)
    return found if found is not None and len(found) <= MAX_PATHS else None


def _paths(users, current, shape, batch_size, path, depth):
    following = users.get(current)
    if not following or depth == 0:
        return None
    found = []
    for node, position in following:
        metadata = node._input_metadata
        if len(metadata) != 1:
            return None
        out, name, step = tuple(metadata[0].shape), type(node).__name__, path + [(node, position)]
        if name in INDEXING:
            if batch_size in out:
                return None
            rest = _paths(users, (node, 0), out, batch_size, step, depth - 1)
        elif name not in SHAPE_ONLY and not (name in ELEMENTWISE and out == shape):
            rest = [step] if _batch_axis(node, shape, out, batch_size) is not None else None
        elif batch_size in out and batch_size not in shape:
            return None
        else:
            rest = _paths(users, (node, 0), out, batch_size, step, depth - 1)
        if rest is None or len(found) + len(rest) > MAX_PATHS:
            return None
        found += rest
    return found


def broadcast_into_batch(users, start, shape, batch_size):
    """Whether the tensor at ``start`` (of ``shape``) reaches its first computing consumers
    through shape-only nodes and is broadcast there along an axis of size ``batch_size`` (each
    of them, where it has several: T5's position bias, added in every layer).

    This tells a shared tensor whose length happens to equal the batch size (positions
    ``arange(T)`` with ``T = B``) from a batched one. An elementwise node that leaves the
    shape as it is (a causal mask applied with ``torch.where``, T5's decoder position bias)
    is walked through: it brings no batch in. Nothing is broadcast into a batch of one
    sample (every axis of size 1 would match it).
    """
    return batch_size >= 2 and _broadcast(users, start, tuple(shape), batch_size, MAX_DEPTH)


def _broadcast(users, current, shape, batch_size, depth):
    following = users.get(current)
    if not following or depth == 0 or len(following) > MAX_PATHS:
        return False
    for node, _ in following:
        if len(node._input_metadata) != 1:
            return False
        out = tuple(node._input_metadata[0].shape)
        name = type(node).__name__
        if name in SHAPE_ONLY or (name in ELEMENTWISE and out == shape):  # (a mask applied before the batch)
            if not _broadcast(users, (node, 0), out, batch_size, depth - 1):
                return False
            continue
        if len(shape) > len(out):
            return False
        aligned = (1,) * (len(out) - len(shape)) + shape
        if not any(c == 1 and o == batch_size for c, o in zip(aligned, out)):
            return False
    return True


def batch_nodes(paths, start_shape, batch_size):
    """``[(node, axis)]``: for each planned path (``plan``), the node where the batch comes in and the
    axis of its output that indexes the samples (what the independence probe checks for it)."""
    return [_batch_node(path, start_shape, batch_size) for path in paths]


def _batch_node(path, start_shape, batch_size):
    node = path[-1][0]
    below = tuple(start_shape) if len(path) == 1 else tuple(path[-2][0]._input_metadata[0].shape)
    return node, _batch_axis(node, below, tuple(node._input_metadata[0].shape), batch_size)


class Path:
    """Per-sample gradients at the start of planned paths, computed in their batch nodes' pre-hooks and
    summed over the paths."""

    def __init__(self, paths, start_shape, batch_size, on_result):
        """
        Args:
            paths: from ``plan``.
            start_shape: shape of the shared tensor.
            batch_size: ``B``.
            on_result: called with the ``[B, *start_shape]`` per-sample gradients, once every path's
                batch node has computed its part (or at ``complete``).
        """
        self.paths = paths
        self.start_shape = tuple(start_shape)
        self.batch_size = batch_size
        self.on_result = on_result
        self._sum, self._fired = None, 0
        self.handles = [node.register_prehook(functools.partial(self._hook, path, axis))
                        for path, (node, axis) in zip(paths, batch_nodes(paths, start_shape, batch_size))]

    def remove(self):
        for handle in self.handles:
            handle.remove()

    def complete(self):
        """Deliver the sum of the parts computed so far (a path that no gradient reached adds nothing)."""
        if self._sum is not None:
            result, self._sum = self._sum, None
            self.on_result(result)

    def _shape_below(self, path, k):
        """Forward output shape of the node below step ``k`` of ``path`` (the start for k = 0)."""
        return self.start_shape if k == 0 else tuple(path[k - 1][0]._input_metadata[0].shape)

    def _hook(self, path, axis, grad_outputs):
        grad = grad_outputs[0]
        if grad is None:
            return None
        node, position = path[-1]
        below = self._shape_below(path, len(path) - 1)
        with torch.no_grad():
            name = type(node).__name__
            if name in ("AddBackward0", "SubBackward0"):
                sign = -1.0 if (name == "SubBackward0" and position == 1) else 1.0
                scale = sign * (float(node._saved_alpha) if position == 1 else 1.0)
                per_sample = _sum_to_per_sample(grad, axis, below) * scale
            else:
                per_sample = torch.stack([
                    _sum_to(_call(node, _only_sample(grad, axis, n), position), below)
                    for n in range(self.batch_size)
                ])
            for k in range(len(path) - 2, -1, -1):  # the nodes that carry it back, to the start
                step, step_position = path[k]
                target = self._shape_below(path, k)
                per_sample = torch.stack([_sum_to(_call(step, g, step_position), target) for g in per_sample])
            self._sum = per_sample if self._sum is None else self._sum + per_sample
        self._fired += 1
        if self._fired % len(self.paths) == 0:
            self.complete()
        return None


def _call(node, grad, position):
    """The gradient a node's backward gives its input ``position`` (a node with one input returns a tensor)."""
    result = node(grad)
    return result if torch.is_tensor(result) else result[position]


def _only_sample(grad, axis, n):
    masked = torch.zeros_like(grad)
    masked.select(axis, n).copy_(grad.select(axis, n))
    return masked


def _sum_to(grad, shape):
    return grad if tuple(grad.shape) == tuple(shape) else grad.sum_to_size(shape)


def _sum_to_per_sample(grad, axis, shape):
    """``[B, *shape]``: each sample's slice of ``grad`` summed to ``shape`` (broadcast rules)."""
    padded = (1,) * (grad.dim() - len(shape)) + tuple(shape)
    dims = [d for d in range(grad.dim()) if d != axis and padded[d] == 1 and grad.shape[d] != 1]
    reduced = grad.sum(dims, keepdim=True) if dims else grad
    return reduced.movedim(axis, 0).reshape(grad.shape[axis], *shape)
