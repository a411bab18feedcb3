"""Per-sample transforms: reductions of one parameter's individual gradients.

A transform runs inside the backward pass, once per tracked parameter, right after
that parameter's individual gradients exist; it returns a small tensor and the
individual gradients are dropped. Quantities declare the transforms they need;
transforms with equal ``key`` are computed once per step and shared.

A transform reads a parameter's individual gradients through ``PerSample``
(``cockpit_lite.engine.per_sample``, with the notation: ``g̃_n = B · grad_batch[n]``,
``g = mean_n g̃_n``). No transform calls ``.item()``.
"""

import functools

import torch

from cockpit_lite import histogram
from cockpit_lite.utils.shards import totals, whole, whole_of

BATCH_ELEMENTS = 1 << 16
"""A parameter with at most this many individual-gradient elements (``B ×`` its size) is
gathered with others for a batchable transform (see ``Batch``)."""

BATCH_FLUSH_ELEMENTS = 1 << 18
"""A batch is computed as soon as it holds this many elements (1 MiB in float32)."""


class Transform:
    """Base class. ``key`` identifies equal transforms; ``__call__`` computes one parameter's value.

    A transform whose fixed cost per call outweighs its work on small parameters may
    also define ``batch(per_samples) -> list of values``, which must equal
    ``[self(p) for p in per_samples]``; ``run`` then gathers small parameters
    across layers (``Batch``) and computes them together.
    """

    key = None
    batch = None
    per_sample_output = False
    """Whether the value has one entry per sample (concatenated across chunks of samples)."""
    summed_over_ranks = True
    """Whether the global batch's value is the sum of the ranks' under torch.distributed (one all-reduce
    adds them); otherwise the ranks' values are gathered and ``combine``d as the values of consecutive
    chunks of samples (a maximum over samples). Not read for ``per_sample_output`` (concatenated)."""
    reads_grad = False
    """Whether the value depends on ``PerSample.grad`` (at a subsampled step the engine runs such
    transforms once autograd has accumulated the parameter's gradient, the others at once)."""
    elementwise = False
    """Whether the value has the parameter's shape and adds over samples (``Σ_n`` of something of
    each element): on a model sharded by FSDP2 each rank keeps its rows of the sum over all ranks'
    samples (``cockpit_lite.sharded``)."""
    from_grad_only = False
    """Whether the value depends on the gradient ``g`` alone, not on the samples: under
    torch.distributed every rank has the global value already (it is not added over the ranks)."""
    shardable = True
    """Whether its values can be combined over the ranks of a model sharded by FSDP2 (added, in rows of
    the parameter, or gathered as one number per sample); a quantity that needs one that cannot is NaN
    with a flag there (``cockpit_lite.sharded.UNSHARDABLE``)."""

    def __call__(self, per_sample):
        raise NotImplementedError

    def combine(self, values):
        """The value of a whole batch from the values of consecutive chunks of its samples."""
        if self.per_sample_output:
            return torch.cat(values)
        if self.from_grad_only:  # (every chunk of samples has the value of the whole batch)
            return values[0]
        return values[0] if len(values) == 1 else sum(values[1:], values[0])


class BatchL2(Transform):
    """Squared norms of the individual gradients, ``‖g̃_n‖² = B² ‖grad_batch[n]‖²``, shape ``[B]``."""

    per_sample_output = True
    key = "batch_l2"

    def __call__(self, per_sample):
        return per_sample.squared_norms() * per_sample.batch_size**2


class GradL2(Transform):
    """``‖g‖²`` of the parameter's gradient as the engine sums it from the individual gradients of
    all ``B`` samples, in their precision: under bf16 autocast autograd's gradient is rounded to 2⁻⁸,
    more than ``Σ_n ‖g̃_n‖² − B ‖g‖²`` of a high-SNR tensor. At a subsampled step of a float32 or
    wider backward pass, autograd's gradient (``PerSample.grad``: there the estimate's own error is
    far larger than float32's rounding). Shape ``[]``."""

    key = "grad_l2"
    reads_grad = True
    from_grad_only = True

    def __call__(self, per_sample):
        return (per_sample.grad**2).sum()

    def combine(self, values):
        """Chunks of one batch's samples (the global path) share its gradient: any one's value."""
        return values[0]


class BatchDotGrad(Transform):
    """Projections of the individual gradients on the gradient, ``g̃_nᵀ g``, shape ``[B]``."""

    per_sample_output = True
    key = "batch_dot_grad"
    reads_grad = True

    def __call__(self, per_sample):
        return per_sample.dots(per_sample.grad) * per_sample.batch_size


class SumGradSquared(Transform):
    """Elementwise second moment sum, ``Σ_n g̃_n² = B² Σ_n grad_batch[n]²``, shape of the parameter."""

    key = "sum_grad_squared"
    elementwise = True

    def __call__(self, per_sample):
        values = per_sample.sum_of_squares() * per_sample.batch_size**2
        return values.reshape(per_sample.param.shape)


class IndividualSquares(Transform):
    """The individual gradients' elementwise squares ``g̃_{n,d}² = B² grad_batch[n,d]²``, shape
    ``[K, *shape]``: for a per-sample sum over elements whose weights are known only after the
    backward pass (``TICDiag``'s ``Σ_d g̃_{n,d}² / C_dd`` at a subsampled step, ``C`` from the same
    backward pass). Held until the step's values are computed: ``K ×`` the parameter's size. Not on a
    model sharded by FSDP2: a value per sample and element of the whole parameter (``shardable``)."""

    per_sample_output = True
    shardable = False
    key = "individual_squares"

    def __call__(self, per_sample):
        return per_sample.grad_batch.square() * per_sample.batch_size**2


class SumGrad(Transform):
    """Sum of the individual gradients, ``Σ_n g̃_n = B Σ_n grad_batch[n]``, shape of the parameter.

    Formed from the same individual gradients, in the same precision, as
    ``SumGradSquared``, so that the variance ``Σ_n g̃_n² / B − (Σ_n g̃_n / B)²`` is a
    difference of consistent terms (autograd's gradient under autocast is rounded
    differently, by up to bf16's 2⁻⁸, more than the variance of a high-SNR element).
    """

    key = "sum_grad"
    elementwise = True

    def __call__(self, per_sample):
        return (per_sample.sample_sum() * per_sample.batch_size).reshape(per_sample.param.shape)


class BatchDotDirection(Transform):
    """Projections ``g̃_nᵀ d`` of the individual gradients on a direction ``d``, shape ``[B]``.

    ``direction(per_sample)`` returns the parameter's slice of ``d`` (it may use
    ``per_sample.grad``, e.g. to predict an optimizer's update). ``key`` must be
    unique to the direction. With ``keep`` (a dict), each ``PerSample`` also goes to
    ``keep[index]`` (``compact``; a list: the chunks of samples of the global path in
    order, or the whole batch) and so outlives the backward pass, for projections onto
    a direction known only later (``dots_of_kept``); ``keep_if(per_sample)``, if given, says
    which parameters' go there (asked once per chunk: it must answer alike for the chunks of
    one parameter); a kept parameter's value is zeros (``direction`` is not asked: its
    projection is made later, onto the later direction). ``reads_grad``: whether
    ``direction`` uses ``per_sample.grad``. A direction sharded over the ranks (a ``DTensor``,
    FSDP2) is gathered once per parameter (``utils.shards.whole``).
    """

    per_sample_output = True

    def __init__(self, key, direction, keep=None, keep_if=None, reads_grad=True):
        self.key = key
        self._direction = direction
        self._keep = keep
        self._keep_if = keep_if
        self.reads_grad = reads_grad

    def __call__(self, per_sample):
        if self._keep is not None and (self._keep_if is None or self._keep_if(per_sample)):
            kept = per_sample.compact()
            all_samples = kept.num_samples == kept.batch_size
            self._keep[kept.index] = [kept] if all_samples else self._keep.get(kept.index, []) + [kept]
            return per_sample.param.new_zeros(per_sample.num_samples, dtype=per_sample.dtype)
        direction = whole_of((self.key, per_sample.index), lambda: self._direction(per_sample))
        return dots_of_kept([per_sample], direction)


def dots_of_kept(per_samples, direction):
    """``g̃_nᵀ d`` of consecutive chunks of one parameter's samples, concatenated, shape ``[B]``
    (what ``dots`` builds is dropped with the chunks: one parameter's ``B ×`` size at a time)."""
    direction = direction.reshape(-1)
    return torch.cat([p.dots(direction.to(p.dtype)) * p.batch_size for p in per_samples])


class GradHistogram1d(Transform):
    """Histogram of all individual-gradient elements ``g̃_{n,d}``: ``(counts, clipped, nonfinite)``."""

    def __init__(self, bins, range):
        self.bins, self.range = int(bins), (float(range[0]), float(range[1]))
        self.key = ("grad_hist_1d", self.bins, self.range)

    def __call__(self, per_sample):
        scale = float(per_sample.batch_size)
        zeros, chunks = per_sample.nonzero_element_chunks()
        parts = [histogram.histogram1d(chunk, self.bins, self.range, scale=scale) for chunk in chunks]
        if zeros:  # the left-out exact zeros go where a zero goes
            zero = per_sample.param.new_zeros(1)
            parts.append(tuple(c * zeros for c in histogram.histogram1d(zero, self.bins, self.range, scale=scale)))
        return _accumulate(parts)

    def combine(self, values):
        return _accumulate(values)

    def batch(self, per_samples):
        scale = float(per_samples[0].batch_size)
        counts, clipped, nonfinite = histogram.histogram1d_batch(
            [p.grad_batch for p in per_samples], self.bins, self.range, scale=scale
        )
        return list(zip(counts.unbind(), clipped.unbind(), nonfinite.unbind()))


class GradHistogram2d(Transform):
    """2-d histogram of pairs ``(g̃_{n,d}, θ_d)``: ``(counts, clipped, nonfinite)``."""

    def __init__(self, bins, range):
        self.bins = (int(bins[0]), int(bins[1]))
        self.range = tuple((float(lo), float(hi)) for lo, hi in range)
        self.key = ("grad_hist_2d", self.bins, self.range)

    def __call__(self, per_sample):
        param = whole(per_sample.param.detach(), key=("param", per_sample.index))  # FSDP2: its whole value
        return _accumulate(
            histogram.histogram2d(chunk, param, self.bins, self.range, scale=float(per_sample.batch_size))
            for chunk in per_sample.element_chunks()
        )

    def combine(self, values):
        return _accumulate(values)


def _accumulate(results):
    """Sum the ``(counts, clipped, nonfinite)`` triples of several histogram calls."""
    total = None
    for result in results:
        total = result if total is None else tuple(t + r for t, r in zip(total, result))
    return total


class Batch:
    """Small parameters gathered for the batchable transforms of one step.

    ``add`` keeps a parameter's ``PerSample`` (and with it its individual gradients)
    until the batch holds ``BATCH_FLUSH_ELEMENTS`` elements or ``flush`` is called
    at the end of the backward pass; then the transform's ``batch`` computes them
    all and the values land in the result dicts that ``run`` returned.
    """

    def __init__(self):
        self._pending = {}  # key -> (transform, [(per_sample, results)], elements)
        self.failed = []  # (parameter index, error) of each parameter in a batch whose computation raised

    def add(self, transform, per_sample, results):
        _, entries, elements = self._pending.setdefault(transform.key, (transform, [], 0))
        entries.append((per_sample, results))
        elements += per_sample.param.numel() * per_sample.num_samples
        self._pending[transform.key] = (transform, entries, elements)
        if elements >= BATCH_FLUSH_ELEMENTS:
            self._compute(transform.key)

    def flush(self):
        """Compute everything still pending."""
        for key in list(self._pending):
            self._compute(key)

    def _compute(self, key):
        transform, entries, _ = self._pending.pop(key)
        try:
            with torch.no_grad():
                values = transform.batch([per_sample for per_sample, _ in entries])
        except Exception as error:  # the engine makes them NaN with a flag (``Engine.finish``)
            self.failed.extend((per_sample.index, error) for per_sample, _ in entries)
            return
        for (_, results), value in zip(entries, values):
            results[key] = value


def run(transforms, per_sample, batch=None, scratch=None):
    """Compute every transform on one parameter's ``PerSample``.

    Histograms run last, so that the other transforms can use the cheaper factored
    forms before the individual gradients are built for the histograms. With a
    ``Batch``, a batchable transform of a small parameter is left to the batch,
    which adds its value to the returned dict when it computes. Individual gradients
    whose ``grad_batch`` has to be built and would exceed ``grad_batch_elements`` go
    through the transforms in chunks of samples (``PerSample.sample_chunks``), and each
    transform ``combine``s its chunks' values: one chunk's elements exist at a time. Their
    gradient ``g``, unless a transform read it before (then from the whole, e.g. a product of
    the factors), is the sum of the chunks' sums, which ``SumGrad`` reads as well. The chunks
    build their elements in ``scratch`` (a ``Scratch``, e.g. the step's; a new one if ``None``).

    Returns:
        dict ``{transform.key: value}``.
    """
    ordered = sorted(transforms, key=lambda t: isinstance(t, (GradHistogram1d, GradHistogram2d)))
    if per_sample.chunked():
        # a transform of ``g`` alone (``GradL2``) runs after the chunks, on their sums, where no transform of the
        # samples reads ``g``: the first chunk would otherwise form it as a product over every position
        # (autograd's own weight-gradient product again), where the chunks' sums cost ``B·D`` additions
        later = [t for t in ordered if t.from_grad_only] if per_sample.reads_own_sum() and not any(
            t.reads_grad and not t.from_grad_only for t in ordered) else []
        chunked = [t for t in ordered if t not in later]
        values, sums = [], []
        for chunk in per_sample.sample_chunks(scratch):
            values.append(_run_whole(chunked, chunk))
            if per_sample.reads_own_sum():  # no transform has read ``g`` yet: the chunks' sums give it
                sums.append(chunk.sample_sum())
        if per_sample.reads_own_sum():
            per_sample.grad = functools.reduce(torch.add, sums)
        results = {t.key: t.combine([v[t.key] for v in values]) for t in chunked}
        with torch.no_grad():
            results.update((t.key, t(per_sample)) for t in later)
        return results
    return _run_whole(ordered, per_sample, batch)


def _run_whole(ordered, per_sample, batch=None):
    """``run`` on the individual gradients as they are (no chunks)."""
    small = per_sample.param.numel() * per_sample.num_samples <= BATCH_ELEMENTS
    results = {}
    with torch.no_grad():
        for t in ordered:
            if batch is not None and small and t.batch is not None:
                batch.add(t, per_sample, results)
            else:
                results[t.key] = t(per_sample)
    return results



def centred_sums_of_squares(data, quantity):
    """Per parameter ``M2_d = Σ_n (g̃_{n,d} − g_d)² = Σ_n g̃_{n,d}² − (Σ_n g̃_{n,d})² / B``.

    From ``SumGradSquared`` and ``SumGrad`` of one step's ``StepData``: sums of the same
    individual gradients, so ``M2 ≥ 0`` up to rounding. The difference loses the
    digits its terms share; once an element's variance is below the rounding of
    ``Σ_n g̃_{n,d}²`` (relative ``√B u`` typically, ``u`` the unit roundoff: a gradient
    nearly the same in every sample), ``M2_d`` can come out negative. A negative
    ``M2_d`` cannot be trusted, nor can the elements beside it: that parameter's
    values are NaN and a flag names it. Computed once per step (``StepData.centred_squares``)
    for all the quantities that read it.

    Returns:
        ``(list of M2 tensors in parameter order, flags)``.
    """
    centred, lost = data.centred_squares
    flags = [
        f"{quantity}: the variance of {count} element(s) of {name} is lost in the rounding "
        f"of Σ_n g̃_n² − B g² in {dtype} (a gradient nearly the same in every sample): NaN for "
        "this parameter"
        for name, count, dtype in lost
    ]
    return centred, flags


def centred_squares(data):
    """``centred_sums_of_squares``' ``M2`` tensors (NaN for a parameter with a negative element)
    and ``(name, number of negative elements, dtype)`` of each such parameter: a few fused
    operations over all parameters (``torch._foreach_*``), one host sync for the sign check."""
    b = data.batch_size
    sums = data.per_sample(SumGrad.key)
    centred = list(torch._foreach_addcmul(data.per_sample(SumGradSquared.key), sums, sums, value=-1 / b))  # (one pass)
    negative = totals(torch._foreach_clamp_max(centred, 0.0)) < 0  # (sharded: over all ranks' elements)
    lost = []
    if bool(negative.any()):
        indices = negative.nonzero().reshape(-1).tolist()
        counts = totals((centred[index] < 0).to(centred[index].dtype) for index in indices).tolist()
        for index, count in zip(indices, counts):
            m2 = centred[index]
            lost.append((data.names[index], int(count), m2.dtype))
            centred[index] = torch.full_like(m2, float("nan"))
    return centred, lost


def ratio_sums(sums, centred, offset):
    """Per parameter ``Σ_d s_d² / (M2_d + offset)`` (``s = SumGrad``, ``M2`` of
    ``centred_sums_of_squares``), one tensor ``[P]`` in parameter order: the signal-to-noise
    sums of ``MeanGSNR`` and ``EarlyStopping``, elementwise in fused operations."""
    ratios = torch._foreach_div(torch._foreach_mul(sums, sums), torch._foreach_add(centred, offset))
    return totals(ratios)
