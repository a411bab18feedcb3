"""One parameter's individual gradients at a step (``PerSample``), in whatever form the layer rule
gave them: built (``grad_batch``), as factors, or as chunks of samples; the per-sample transforms
(``cockpit_lite.engine.transforms``) read them through it.

Notation (per parameter tensor, batch of B samples): BackPACK's ``grad_batch[n]`` is
sample n's contribution to the reduced loss, so ``grad_batch.sum(0)`` is the
gradient ``g``. The *individual gradient* is ``g̃_n = B · grad_batch[n]``, so that
``g = mean_n g̃_n`` for both ``reduction="mean"`` (then ``g̃_n = ∇ℓ_n``) and
``reduction="sum"`` (then ``g̃_n = B ∇ℓ_n``, the per-sample estimate of ``∇L``).
This is the convention of Cockpit's formulas.
"""

import functools
import math
from functools import cached_property

import torch

CHUNK_ELEMENTS = 1 << 20
"""Individual-gradient elements built at a time for histograms of factored layers (4 MiB in float32)."""

GRAD_BATCH_ELEMENTS = 1 << 22
"""The most individual-gradient elements (16 MiB in float32) a parameter's transforms see at
once when its ``grad_batch`` has to be built (factors with sequence axes, summed uses):
beyond, they run on consecutive chunks of samples (``PerSample.sample_chunks``)."""

CPU_GRAD_BATCH_ELEMENTS = 1 << 18
"""On the CPU, the chunks hold at most this many elements (1 MiB in float32): a chunk and its
squares stay in a core's L2 cache between the contraction that forms it and the reductions
that read it (measured: the transformer's per-sample step 4 % faster than with 16 MiB chunks,
which make every reduction a pass over main memory). Elsewhere a chunk costs kernel launches:
``GRAD_BATCH_ELEMENTS``."""


def grad_batch_elements(device):
    """The most elements of a chunk of built individual gradients on ``device`` (``sample_chunks``)."""
    if device.type == "cpu":
        return min(GRAD_BATCH_ELEMENTS, CPU_GRAD_BATCH_ELEMENTS)
    return GRAD_BATCH_ELEMENTS

SKETCH_RANK = 3
"""Columns of the random sketch that checks a factored parameter's individual gradients against
autograd's gradient at a subsampled step (``PerSample.check``)."""


class PerSample:
    """The individual gradients of one parameter, and the primitives transforms are built from.

    One of four forms (``K`` samples, ``K = B`` except for a subsample and for chunks of
    samples, ``cockpit_lite.engine.global_path`` and ``sample_chunks``):

    - ``grad_batch``: ``[K, *shape]``, each sample's contribution to the reduced loss;
    - ``factors = (a, δ)`` with ``a`` of shape ``[K, L, I]`` (layer inputs) and ``δ`` of
      shape ``[K, L, O]`` (gradients w.r.t. the layer outputs), such that
      ``grad_batch[n] = Σ_l δ[n, l] a[n, l]ᵀ`` (a Linear layer's weight, ``L`` the
      flattened non-batch axes). Norms, dot products and second moments come from the
      factors ("ghost" norms); ``[K, O, I]`` is built only if a transform needs its
      elements (histograms);
    - ``rows = (values, samples, index, K)``: ``grad_batch[samples[u], index[u]] =
      values[u]`` and zero elsewhere, each ``(sample, index)`` pair once, ``samples``
      ascending (an Embedding weight: only the looked-up rows are non-zero);
    - ``parts``: ``PerSample`` objects of the same parameter in the other forms, whose
      individual gradients add up to this one's (a parameter used several times: a
      tied embedding and head); ``grad_batch`` is their sum, formed when needed.

    Attributes:
        param: the parameter tensor.
        index: position of the parameter in the Cockpit's parameter list.
        batch_size: ``B``, the number of samples of the whole batch (the scale of
            ``g̃_n = B · grad_batch[n]``; under DDP ``B / W``, ``cockpit_lite.distributed``).
        grad_before: the gradient the optimizer had before this backward pass
            (gradient accumulation), or ``None``.
    """

    def __init__(self, param, index, grad_batch=None, factors=None, rows=None, parts=None, batch_size=None,
                 grad_before=None):
        self.param = param
        self.index = index
        self._factors = factors
        self._rows = rows
        self._parts = parts
        self.grad_before = grad_before
        self._grad = None
        self._whole = None  # the individual gradients of all samples that these were selected from
        self._grad_source = None  # a callable giving ``g`` when it is first read (rules)
        self._check_source = None  # a callable giving ``check``'s value (rules)
        self._sum = None  # ``sample_sum``, once formed
        self._scratch = None  # a chunk's ``Scratch``: memory it builds ``grad_batch`` and its squares in
        self._square_sums = None  # ``square_sums``, once formed
        if grad_batch is not None:
            self.grad_batch = at_least_float32(grad_batch)
        if batch_size is not None:  # (under DDP ``B / W``: not an integer where the shards are unequal)
            batch_size = int(batch_size) if float(batch_size).is_integer() else float(batch_size)
        self.batch_size = self.num_samples if batch_size is None else batch_size

    @classmethod
    def zeros(cls, param, index, samples, **kwargs):
        """``samples`` individual gradients that are all zero (a parameter the loss does not reach), in
        the rows form without a row: no ``[K, *shape]`` tensor is formed unless a transform reads every
        element (the 2-d histogram), and then in chunks."""
        like = {"dtype": param.dtype, "device": param.device}  # (plain tensors: FSDP2's parameters are DTensors)
        if not param.dim():
            return cls(param, index, grad_batch=torch.zeros((samples,), **like), **kwargs)
        values = at_least_float32(torch.zeros((0, param.numel() // max(param.shape[0], 1)), **like))
        none = torch.zeros(0, dtype=torch.long, device=param.device)
        return cls(param, index, rows=(values, none, none, samples), **kwargs)

    @property
    def dtype(self):
        """The dtype the statistics are computed in (float32 or wider)."""
        if "grad_batch" in vars(self):
            return self.grad_batch.dtype
        if self._factors is not None:
            return self._factors[0].dtype
        if self._rows is not None:
            return self._rows[0].dtype
        if self._parts is not None:
            return functools.reduce(torch.promote_types, (p.dtype for p in self._parts))
        return self.grad_batch.dtype

    @property
    def num_samples(self):
        """``K``, the number of samples held here."""
        if self._factors is not None:
            return self._factors[0].shape[0]
        if self._rows is not None and "grad_batch" not in vars(self):
            return self._rows[3]
        if self._parts is not None:
            return self._parts[0].num_samples
        return self.grad_batch.shape[0]

    @property
    def optimizer_grad(self):
        """The gradient the optimizer will see: this pass's ``g`` plus ``grad_before``."""
        if self.grad_before is None:
            return self.grad
        return self.grad + self.grad_before.reshape(-1).to(self.grad.dtype)

    @cached_property
    def grad_batch(self):
        """``[K, *shape]`` contributions to the reduced loss (built from the factors, rows or parts if needed)."""
        if self._parts is not None:  # a part of its own first (not one to add into: a part is only read)
            first, *others = sorted(self._parts, key=lambda p: p._dense())
            first._scratch = self._scratch
            dense = first.owned_grad_batch().to(self.dtype)
            for part in others:
                part.add_to(dense)
            return dense
        if self._rows is not None:
            values, samples, index, k = self._rows
            dense = values.new_zeros((k, self.param.shape[0], values.shape[1]))
            dense[samples, index] = values
            return dense.reshape(k, *self.param.shape)
        a, delta = self._factors
        if self._scratch is None:
            return torch.einsum("nlo,nli->noi", delta, a).reshape(self.num_samples, *self.param.shape)
        out = self._scratch.get("grad_batch", (self.num_samples, delta.shape[-1], a.shape[-1]), a.dtype, a.device)
        return torch.bmm(delta.transpose(1, 2), a, out=out).view(self.num_samples, *self.param.shape)

    @cached_property
    def flat(self):
        """``grad_batch`` as ``[K, D]``."""
        return self.grad_batch.reshape(self.num_samples, -1)

    @property
    def grad(self):
        """The gradient ``g`` of this parameter, shape ``[D]``: ``sample_sum()`` unless the engine
        set another (autograd's total on the global path and at a subsampled step, the ranks' mean
        under DDP); for a subsample's rows, that of all samples (those they were ``select``-ed from,
        or a rule's ``_grad_source``). Formed when first read."""
        if self._grad is None:
            if self._whole is not None:
                self._grad = self._whole.grad
            else:
                self._grad = self.sample_sum() if self._grad_source is None else self._grad_source()
            self._forget_sources()
        return self._grad

    @grad.setter
    def grad(self, value):
        self._grad = at_least_float32(value)
        self._forget_sources()

    def _forget_sources(self):
        self._whole = self._grad_source = self._check_source = None

    def check(self, generator):
        """``(value, project)`` to check these individual gradients against autograd's gradient
        ``G`` of the parameter (its shape) without forming their sum where that costs a product:
        ``value`` should equal ``project(G)`` up to rounding, both scaled so that the norm of a
        difference ``E = Σ_n grad_batch[n] − G`` comes out as about ``‖E‖`` (``project`` ``None``:
        ``value`` is the sum itself, compared with ``G`` whole).

        For factors (``a``, ``δ``; a Linear layer's weight, ``[O, I]``) it is the random sketch
        ``s_j = u_jᵀ (Σ_n grad_batch[n]) v_j = (δ u_j)ᵀ (a v_j)`` for ``j < r = SKETCH_RANK``,
        ``u_j: [O]``, ``v_j: [I]`` with independent normal entries of variance ``r^(-1/2)`` from ``generator``,
        for which ``E Σ_j (u_jᵀ E v_j)² = ‖E‖²``: one pass over each factor (``r·L·(O + I)``
        multiplications per sample instead of ``L·O·I``). A wrong capture (another tensor, a use
        not seen, another loss) makes ``‖E‖`` as large as ``‖G‖``; the sketch misses it only if
        all ``r`` products of two normal variates fall below ``GRAD_CHECK_RTOL``, with probability
        about ``10⁻⁷`` at ``r = 3``. A subsample's rows (``select``) are checked by the samples
        they came from; a rule may give its own check (``_check_source``).
        """
        if self._grad is not None:
            return self._grad, None
        if self._check_source is not None:
            return self._check_source(generator)
        if self._whole is not None:
            return self._whole.check(generator)
        if self._factors is None or "grad_batch" in vars(self):
            return self.grad, None
        return self.sketch(generator)

    def sketch(self, generator):
        """``check``'s random sketch ``(value, project)`` in any form: from the factors as there, else
        ``project`` of the sum (cheap where no product forms it: rows, ``grad_batch``). The
        parameter is taken as a ``[O, I]`` matrix (``O`` its first axis); the same ``generator``
        state gives the same ``u_j, v_j``, so the sketches of a parameter's several uses add up."""
        rows = self.param.shape[0] if self.param.dim() else 1
        columns = self.param.numel() // max(rows, 1)
        device, dtype = self.param.device, self.dtype
        left, right = (
            (torch.randn((SKETCH_RANK, n), generator=generator) * SKETCH_RANK**-0.25).to(device=device, dtype=dtype)
            for n in (rows, columns)
        )

        def project(grad):
            return ((left @ grad.reshape(rows, columns).to(dtype)) * right).sum(1)

        if self._factors is None or "grad_batch" in vars(self):
            return project(self.grad), project
        a, delta = (t.to(dtype) for t in _positions(*self._factors))
        return ((left @ delta.T) * (right @ a.T)).sum(1), project  # [r, L]-shaped products: one pass over each factor

    def reads_own_sum(self):
        """Whether ``grad`` is still to be formed as ``sample_sum()`` (neither set nor given by a rule,
        nor taken from the samples these were selected from)."""
        return self._grad is None and self._whole is None and self._grad_source is None

    def sample_sum(self):
        """``Σ_n grad_batch[n]`` of the samples held here, from the individual gradients themselves, shape ``[D]``
        (from ``grad_batch`` once it is formed: ``B·D`` additions instead of a product over every position).
        Formed once (``SumGrad`` and the check against autograd both read it)."""
        if self._sum is None:
            self._sum = self._sample_sum()
        return self._sum

    def _sample_sum(self):
        if "grad_batch" in vars(self):
            return self.flat.sum(0)
        if self._factors is not None:
            a, delta = _positions(*self._factors)
            return (delta.T @ a).reshape(-1)
        if self._sparse():
            values, _, index, _ = self._rows
            return values.new_zeros((self.param.shape[0], values.shape[1])).index_add_(0, index, values).reshape(-1)
        if self._parts is not None:
            return sum(p.sample_sum().to(self.dtype) for p in self._parts)
        return self.flat.sum(0)

    def dots(self, vector):
        """``grad_batch[n]ᵀ v`` for every sample, shape ``[B]`` (``v`` of shape ``[D]``).

        Factors with sequence axes build ``grad_batch`` (as ``squared_norms`` does): one
        ``B·L·O·I`` contraction, after which every dot product costs ``B·O·I``, where the
        factored form would cost ``B·L·O·I`` each time.
        """
        if self._single_position() and "grad_batch" not in vars(self):
            a, delta = self._factors  # δ_nᵀ V a_n
            matrix = vector.reshape(delta.shape[-1], a.shape[-1])
            return ((delta[:, 0] @ matrix) * a[:, 0]).sum(1)
        if self._sparse():
            values, samples, index, k = self._rows
            row_dots = (values * vector.reshape(self.param.shape[0], -1)[index]).sum(1)
            return values.new_zeros(k).index_add_(0, samples, row_dots)
        return self.flat @ vector

    def squared_norms(self):
        """``‖grad_batch[n]‖²`` for every sample, shape ``[B]``."""
        if self._single_position():
            a2, delta2 = self._squared_factors  # ‖δ aᵀ‖² = ‖δ‖² ‖a‖²
            return delta2.sum(1) * a2.sum(1)
        if self._sparse():
            values, samples, _, k = self._rows
            return values.new_zeros(k).index_add_(0, samples, values.square().sum(1))
        return self.square_sums()[0]

    def sum_of_squares(self):
        """``Σ_n grad_batch[n]²`` elementwise, shape ``[D]``."""
        if self._single_position():
            a2, delta2 = self._squared_factors  # Σ_n δ_{n,o}² a_{n,i}²
            return (delta2.T @ a2).reshape(-1)
        if self._sparse():
            values, _, index, _ = self._rows
            squares = values.new_zeros((self.param.shape[0], values.shape[1]))
            return squares.index_add_(0, index, values.square()).reshape(-1)
        return self.square_sums()[1]

    def square_sums(self):
        """``(‖grad_batch[n]‖² [K], Σ_n grad_batch[n]² [D])`` of ``grad_batch``, from one pass of
        squares for both (formed once): pieces of consecutive samples of at most
        ``grad_batch_elements`` elements are squared into the same memory (a chunk's ``Scratch``,
        else one of its own), so the ``[K, D]`` squares never exist whole."""
        if self._square_sums is None:
            flat = self.flat
            step = max(1, grad_batch_elements(flat.device) // max(flat.shape[1], 1))
            if (self._scratch is None and step >= flat.shape[0]) or not flat.shape[0]:  # one piece: no scratch
                squares = flat.square()
                self._square_sums = (squares.sum(1), squares.sum(0))
                return self._square_sums
            scratch = Scratch() if self._scratch is None else self._scratch
            norms, sums = [], None
            for start in range(0, flat.shape[0], step):
                rows = flat[start : start + step]
                squares = torch.mul(rows, rows, out=scratch.get("squares", rows.shape, rows.dtype, rows.device))
                norms.append(squares.sum(1))
                sums = squares.sum(0) if sums is None else sums.add_(squares.sum(0))
            self._square_sums = (norms[0] if len(norms) == 1 else torch.cat(norms), sums)
        return self._square_sums

    def compact(self):
        """The same individual gradients in the form they came in (factors, rows, parts or
        ``grad_batch``), without what was built from them since (``grad_batch`` of factors):
        what keeping them beyond the backward pass costs."""
        if self._dense():
            return PerSample(self.param, self.index, grad_batch=self.grad_batch, batch_size=self.batch_size)
        parts = None if self._parts is None else [p.compact() for p in self._parts]
        return PerSample(self.param, self.index, factors=self._factors, rows=self._rows, parts=parts,
                         batch_size=self.batch_size)

    def add_to(self, dense):
        """``dense += grad_batch`` in place (``dense`` of shape ``[K, *shape]``; another use's
        individual gradients of the same parameter), without forming this use's ``grad_batch``
        from its factors or rows. Returns ``dense``."""
        if self._factors is not None and "grad_batch" not in vars(self):
            a, delta = self._factors
            dense.view(self.num_samples, delta.shape[-1], a.shape[-1]).baddbmm_(
                delta.transpose(1, 2).to(dense.dtype), a.to(dense.dtype))
        elif self._sparse():
            values, samples, index, k = self._rows
            dense.view(k, self.param.shape[0], -1).index_put_((samples, index), values.to(dense.dtype), accumulate=True)
        elif self._parts is not None and "grad_batch" not in vars(self):
            for part in self._parts:
                part.add_to(dense)
        else:
            dense.add_(self.grad_batch.reshape(dense.shape))
        return dense

    def owned_grad_batch(self):
        """``grad_batch`` as a tensor of its own (built from the factors, rows or parts, else
        copied), which ``add_to`` may then add into."""
        if not self._dense() and "grad_batch" not in vars(self):
            return self.grad_batch
        return self.grad_batch.clone()

    def held_elements(self):
        """How many elements the individual gradients take in the form they came in (factors,
        rows, parts or ``grad_batch``)."""
        if self._dense():
            return self.grad_batch.numel()
        if self._parts is not None:
            return sum(p.held_elements() for p in self._parts)
        pieces = self._factors if self._factors is not None else self._rows[:3]
        return sum(t.numel() for t in pieces)

    def select(self, rows, with_grad=True):
        """The individual gradients of the samples ``rows`` only (sorted indices, a subsample,
        or a ``slice`` of consecutive ones): ``K = len(rows)``, in the form they came in, with
        this one's ``B`` and gradient ``g`` (of all ``B`` samples: formed from these when the
        part's ``grad`` is first read, unless it is set before, and until then these are kept).
        ``with_grad=False``: without (the part holds only its rows; a use of a parameter whose
        gradient is set on the sum of its uses)."""
        part = self._rows_of(rows)
        if not with_grad:
            return part
        if self._grad is not None:
            part._grad = self._grad
        else:
            part._whole = self
        return part

    def _rows_of(self, rows):
        """``select`` without the gradient."""
        count = len(range(self.num_samples)[rows]) if isinstance(rows, slice) else len(rows)
        if self._factors is not None and "grad_batch" not in vars(self):
            a, delta = self._factors
            forms = {"factors": (a[rows], delta[rows])}
        elif self._sparse() and isinstance(rows, slice) and rows.step in (None, 1):  # a run of entries
            values, samples, index, _ = self._rows
            start = range(self.num_samples)[rows].start
            first, end = torch.searchsorted(samples, samples.new_tensor([start, start + count])).tolist()
            forms = {"rows": (values[first:end], samples[first:end] - start, index[first:end], count)}
        elif self._sparse():
            values, samples, index, k = self._rows
            position = samples.new_full((k,), -1)
            position[rows] = torch.arange(count, device=samples.device)
            kept = position[samples]
            chosen = kept >= 0
            forms = {"rows": (values[chosen], kept[chosen], index[chosen], count)}
        elif self._parts is not None and "grad_batch" not in vars(self):
            forms = {"parts": [p._rows_of(rows) for p in self._parts]}
        else:
            forms = {"grad_batch": self.grad_batch[rows]}
        return PerSample(self.param, self.index, batch_size=self.batch_size, grad_before=self.grad_before, **forms)

    def chunked(self):
        """Whether transforms should see these individual gradients in ``sample_chunks``: their
        ``grad_batch`` would have to be built (factors with sequence axes, parts) and would hold
        more than ``grad_batch_elements`` elements."""
        builds = self._parts is not None or (self._factors is not None and not self._single_position())
        limit = grad_batch_elements(self.param.device)
        return builds and "grad_batch" not in vars(self) and self.num_samples * self.param.numel() > limit

    def sample_chunks(self, scratch=None):
        """The individual gradients as ``select``-ed pieces of consecutive samples, each of at
        most ``grad_batch_elements`` elements once its ``grad_batch`` is formed (at least one
        sample; pieces of about equal size), made one at a time, so that the whole ``[K, *shape]``
        never exists. Each builds its ``grad_batch`` and squares in ``scratch`` (a ``Scratch``;
        one of their own if ``None``), which the next one overwrites."""
        pieces = -(-self.num_samples * self.param.numel() // grad_batch_elements(self.param.device))
        step = -(-self.num_samples // pieces)
        scratch = Scratch() if scratch is None else scratch
        for start in range(0, self.num_samples, step):
            chunk = self.select(slice(start, start + step))
            chunk._scratch = scratch  # a chunk is read and dropped before the next one is built
            yield chunk

    def element_chunks(self, max_elements=CHUNK_ELEMENTS):
        """The individual gradients as ``[c, *shape]`` pieces of consecutive samples.

        The pieces of factors or parts are built one at a time (about ``max_elements``
        elements each, cache-sized), so the whole ``[K, *shape]`` tensor never exists;
        otherwise ``grad_batch`` is the only piece.
        """
        if (self._factors is None and self._parts is None) or "grad_batch" in vars(self):
            yield self.grad_batch
            return
        step = max(1, max_elements // self.param.numel())
        for start in range(0, self.num_samples, step):
            yield self._rows_of(slice(start, start + step)).grad_batch

    def nonzero_element_chunks(self, max_elements=CHUNK_ELEMENTS):
        """``element_chunks`` with (some) exact zeros left out: returns ``(zeros, chunks)``.

        ``chunks`` iterates over tensors of individual-gradient elements and ``zeros``
        counts the exact zeros that are in none of them. A factored layer without
        sequence axes on the CPU leaves out the rows ``δ_{n,o} a_nᵀ`` with
        ``δ_{n,o} = 0`` (the units a ReLU switched off, often half of them), which
        are never built; a sample whose input is not finite keeps all its rows
        (``0 · ∞`` is NaN). Elsewhere ``zeros`` is 0 (on a GPU, finding the rows
        would wait for the device).
        """
        if self._sparse():  # only the looked-up rows are non-zero
            values = self._rows[0]
            return self.num_samples * self.param.numel() - values.numel(), iter((values,))
        if not self._single_position() or self.param.device.type != "cpu" or "grad_batch" in vars(self):
            return 0, self.element_chunks(max_elements)
        a, delta = self._factors[0][:, 0], self._factors[1][:, 0]  # [B, I], [B, O]
        keep = (delta != 0) | ~torch.isfinite(a).all(1, keepdim=True)
        samples, units = keep.nonzero().unbind(1)
        values = delta[samples, units]
        step = max(1, max_elements // a.shape[1])

        def chunks():
            for start in range(0, len(values), step):
                rows = a.index_select(0, samples[start : start + step])
                yield rows.mul_(values[start : start + step, None])

        return (delta.numel() - len(values)) * a.shape[1], chunks()

    def _sparse(self):
        """Rows form, not yet materialised."""
        return self._rows is not None and "grad_batch" not in vars(self)

    def _dense(self):
        """``grad_batch`` form (given, not built from another form)."""
        return self._factors is None and self._rows is None and self._parts is None

    @cached_property
    def _squared_factors(self):
        """``(a², δ²)`` of single-position factors, ``[K, I]`` and ``[K, O]`` (read by both ``squared_norms``
        and ``sum_of_squares``)."""
        a, delta = self._factors
        return a[:, 0].square(), delta[:, 0].square()

    def _single_position(self):
        """Factors without sequence axes, where the ghost formulas are exact and cheapest."""
        return self._factors is not None and self._factors[0].shape[1] == 1


class Scratch:
    """Memory that the consecutive chunks of parameters' samples (``PerSample.sample_chunks``)
    build their individual gradients and squares in, one chunk after the other (a step's
    parameters share one: ``run``'s ``scratch``): a fresh
    allocation of a chunk's size comes back from the system as new pages, and writing them
    costs more than the reductions that read them (measured on the CPU: the chunks of a GPT's
    ``[64, 256, 64]`` MLP weight 0.94 ms instead of 1.30 ms). What a chunk gives its transforms
    must not hold a view of it: each transform returns a reduction."""

    def __init__(self):
        self._tensors = {}

    def get(self, name, shape, dtype, device):
        """A ``shape`` tensor of uninitialised memory, the same for every call with ``name``."""
        numel = math.prod(shape)
        memory = self._tensors.get(name)
        if memory is None or memory.numel() < numel or memory.dtype != dtype or memory.device != device:
            memory = self._tensors[name] = torch.empty(numel, dtype=dtype, device=device)
        return memory[:numel].view(shape)


def _positions(a, delta):
    """The factors ``[K, L, I]`` and ``[K, L, O]`` as ``[K·L, I]`` and ``[K·L, O]``, their
    leading axes flattened in the same order: that of ``δ``'s memory (a sum over the
    positions does not depend on it), so that factors regrouped per sample from
    sequence-first rows (``[T, B, ·]`` viewed as ``[B, T, ·]``: attention's projections) are
    not copied."""
    order = sorted(range(delta.dim() - 1), key=lambda axis: -delta.stride(axis))
    return tuple(t.permute(*order, t.dim() - 1).reshape(-1, t.shape[-1]) for t in (a, delta))


def at_least_float32(tensor):
    """``tensor`` in float32 if it is of a narrower floating dtype (bf16 / fp16 models)."""
    if tensor.is_floating_point() and torch.finfo(tensor.dtype).bits < 32:
        return tensor.float()
    return tensor
