"""The probe of sample independence: does a sample's loss depend on other samples' outputs of a layer?

A layer's rule forms sample n's gradient from row n of the layer's output gradient,
``δ_n = Σ_m ∂c_m/∂z_n`` (``z`` the layer's output, ``c`` the samples' terms of the loss). That is
``∇_θ c_n`` only when ``∂c_m/∂z_n = 0`` for every ``m ≠ n``: nothing between the layer and the loss
mixes the samples. BatchNorm is recognised by its type (``rules.mixes_samples``); code of the
training loop or of a model's ``forward`` is not: a loss over pairs of samples (a contrastive loss,
``F.cross_entropy(z1 @ z2.T, arange(B))``), batch statistics (``h - h.mean(0)``, a functional
``F.batch_norm``). The individual gradients then still sum to autograd's gradient, so the engine's
check (``cockpit_lite.engine.check``) cannot see it.

The probe takes two vector-Jacobian products of ``c`` down to the outputs of the layers whose
rules would read them, with the weights ``1`` and with random weights ``w`` (in ``[0.5, 1.5]``,
all different): ``u(1)_n = δ_n`` and ``u(w)_n = Σ_m w_m ∂c_m/∂z_n``, which equals ``w_n δ_n``
for every row ``n`` exactly when the samples are independent. A layer's output is *mixed* when
some row differs by more than ``RTOL`` (of the lowest precision involved) of ``max(‖w_n δ_n‖, FLOOR · max_m ‖w_m δ_m‖)``,
rows along the axis its rule reads as the samples: its parameters take the exact global path. The
node where a shared tensor's path (``cockpit_lite.engine.broadcast``) splits the batch's rows is
checked the same way: a node whose output is as long as the batch by its own shape, no sample in it
yet, is found there. The probe runs when
the step's plan is new (the calls it would read and the loss's last operation): it costs two
backward passes down to the layers' outputs (without the weights' gradients).
"""

import torch
from torch.autograd.graph import GradientEdge

from cockpit_lite.engine.rules.generic import output_axes

RTOL = {torch.float64: 1e-6, torch.float32: 1e-3}
"""Largest relative difference of a row from independence, by the lowest precision among the
products' starting point and the probed outputs (a half-precision one: ``LOW_PRECISION_RTOL``).
Healthy models measured in docs/models.md#limits."""
LOW_PRECISION_RTOL = 5e-2
FLOOR = 1e-3
"""Rows whose output gradient is below this fraction of the largest row's (padding positions,
samples the loss ignores) are compared against the largest row's scale instead of their own."""


class Probe:
    """Which layers' output gradients mix the samples, found once per plan (see the module docstring)."""

    def __init__(self):
        self._seen = set()
        self._weights = torch.Generator().manual_seed(0)  # its own stream: the user's is untouched

    def mixed(self, calls, loss, contributions, roots=(), batch_size=None, shared=()):
        """The calls among ``calls`` whose output gradient mixes the samples, and the owners among
        ``shared`` (``(owner, node, axis)``: where a shared tensor's path takes the batch's rows) whose
        node's output does along ``axis`` (a new plan only; otherwise nothing).

        ``contributions()`` gives ``c`` with its graph, or raises ``ValueError``; then the model's
        own calls ``roots`` stand in for the loss, with random row vectors ``r`` of its output ``Z``
        (``Σ_n w_n <r_n, Z_n>``, rows along its first axis of size ``batch_size``): what mixes the
        samples inside the model is found, what mixes them after it (in the loss) cannot be.
        """
        key = (tuple(id(call.module) for call in calls), tuple((type(node).__name__, axis) for _, node, axis in shared),
               type(getattr(loss, "grad_fn", None)).__name__)
        if key in self._seen or not (calls or shared):
            return []
        self._seen.add(key)
        source = self._source(contributions, roots, batch_size)
        if source is None:
            return []
        outputs, directions, batch = source
        targets = [  # (owner, the output's gradient edge, its rows' axis, its dtype)
            (call, GradientEdge(leaf.grad_fn, leaf.output_nr), axis, leaf.dtype) for call in calls if call not in roots
            for leaf, axis in zip(call.leaves, output_axes(call, batch)) if leaf.grad_fn is not None and axis is not None
        ] + [(owner, GradientEdge(node, 0), axis, node._input_metadata[0].dtype) for owner, node, axis in shared
             if axis is not None and node._input_metadata[0].shape[axis] == batch]
        if not targets:
            return []
        owners, edges, axes, dtypes = zip(*targets)
        weights, start = self._draw(batch), directions(None)
        try:
            with torch.enable_grad():
                ones = torch.autograd.grad(outputs, edges, start, retain_graph=True, allow_unused=True)
                weighted = torch.autograd.grad(outputs, edges, directions(weights), retain_graph=True, allow_unused=True)
        except RuntimeError:  # (a reentrant checkpoint refuses .grad: its parameters are refused elsewhere)
            return []
        rtol = max(RTOL.get(dtype, LOW_PRECISION_RTOL) for dtype in {*dtypes, *(t.dtype for t in start)})
        products = [(owner, one, many, axis) for owner, one, many, axis in zip(owners, ones, weighted, axes) if one is not None]
        if not all(bool(torch.isfinite(one).all() and torch.isfinite(many).all()) for _, one, many, _ in products):
            self._seen.discard(key)  # (a non-finite step tells nothing: the next tracked step probes again)
            return []
        found = []
        for owner, one, many, axis in products:
            if owner not in found and _mixes(one, many, weights, rtol, axis):
                found.append(owner)
        return found

    def _draw(self, batch):
        """``batch`` weights in ``[0.5, 1.5]``, multiples of 1/128 (exact in bfloat16 and float16, so the
        products' rounding is the backward pass's alone), all different up to 129 samples."""
        steps = torch.randperm(129, generator=self._weights)[:batch] if batch <= 129 else \
            torch.randint(0, 129, (batch,), generator=self._weights)
        return 0.5 + steps.double() / 128

    def _source(self, contributions, roots, batch_size):
        """``(outputs, directions, B)``: what the products start from, and ``directions(w)``, their
        weights (``w=None``: all ones); ``None`` when there is nothing to start from."""
        try:
            c = contributions()
        except ValueError:
            c = None
        if c is not None:
            return [c], lambda w: [torch.ones_like(c) if w is None else w.to(c.device, c.dtype)], c.shape[0]
        leaves = [leaf for root in roots for leaf in root.leaves if leaf.grad_fn is not None]
        if batch_size is None or not leaves or any(batch_size not in leaf.shape for leaf in leaves):
            return None
        rows = [torch.empty(leaf.shape, dtype=torch.float64).uniform_(-1, 1, generator=self._weights) for leaf in leaves]
        axes = [list(leaf.shape).index(batch_size) for leaf in leaves]

        def directions(w):
            return [
                (r if w is None else r * w.reshape([-1 if k == axis else 1 for k in range(r.dim())]))
                .to(leaf.device, leaf.dtype)
                for r, leaf, axis in zip(rows, leaves, axes)
            ]

        return [GradientEdge(leaf.grad_fn, leaf.output_nr) for leaf in leaves], directions, batch_size


def _mixes(ones, weighted, weights, rtol, axis):
    """Whether ``weighted`` differs from ``weights ⊙ ones`` by more than ``rtol`` (``departure``)."""
    return departure(ones, weighted, weights, axis) > rtol


def departure(ones, weighted, weights, axis):
    """How far ``weighted`` is from ``weights ⊙ ones``: the largest row's ``‖weighted_n − w_n ones_n‖``
    over the row's scale (``max(‖w_n ones_n‖, FLOOR · the largest row's)``), rows along ``axis``, the
    one the layer's rule reads as the samples (``rules.generic.output_axes``: a ``[T, B, ...]`` output
    with ``T = B`` of a Linear layer is read along ``T``, and mixed there). ``0`` for a gradient of
    zeros; ``inf`` when ``axis`` is not of size ``B``."""
    ones, weighted = ones.double(), weighted.double()
    batch = weights.shape[0]
    if ones.shape[axis] != batch:
        return float("inf")
    shape = [1] * ones.dim()
    shape[axis] = batch
    expected = weights.double().reshape(shape) * ones
    scale = _row_norms(expected, axis)
    if scale.max() == 0:
        return 0.0
    scale = torch.maximum(scale, FLOOR * scale.max())
    return float((_row_norms(weighted - expected, axis) / scale).max())


def _row_norms(tensor, axis):
    return tensor.movedim(axis, 0).reshape(tensor.shape[axis], -1).norm(dim=1)
