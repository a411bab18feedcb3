"""``StepData``: everything a quantity may read after one step's backward pass."""

import math
from functools import cached_property, lru_cache

import torch

from cockpit_lite.engine import transforms as _transforms
from cockpit_lite.engine.per_sample import PerSample
from cockpit_lite.utils.grads import held
from cockpit_lite.utils.norms import norms
from cockpit_lite.utils.shards import totals


@lru_cache(maxsize=64)
def _level_factors(sizes, batch_size, total, dtype, device):
    """``2 (u + √(D + B) u_acc)`` of ``StepData.rounding_level`` for parameters of ``sizes`` elements (their
    total first with ``total``), in ``dtype`` on ``device``: the same at every step of a run (kept, never
    written to)."""
    sizes = torch.tensor([sum(sizes)] * total + list(sizes), dtype=torch.float64)
    u = torch.finfo(dtype).eps / 2
    u_acc = torch.finfo(torch.promote_types(dtype, torch.float32)).eps / 2
    return (2 * (u + (sizes + batch_size).sqrt() * u_acc)).to(device, dtype)


class StepData:
    """The bundle handed to ``Quantity.compute``.

    Attributes:
        step: the global step.
        params: the tracked parameters (in order).
        names: their names.
        info: the step's ``StepInfo``.
        batch_size: B, from the individual gradients (``None`` when none were computed).
        subset: the sample indices of a subsampled step (``samples``), or ``None``.
        grads: detached gradients of this backward pass, zeros for a parameter that got
            none. Under gradient accumulation (a gradient was present before the backward
            pass), the gradient of this backward pass alone, so that every quantity
            describes the same (micro-)batch. An accumulated step (``Cockpit(accumulate=True)``)
            is one batch, all its micro-batches: the gradient they left (``grads_after``, taken
            after the last backward pass, before clipping) minus what was there before the first.
    """

    def __init__(self, step, params, names, info, per_sample, batch_size, transforms, grads_before=None,
                 group=None, pass_grads=None, grads_after=None, diagonals=None, noise=()):
        self.step = step
        self.params = params
        self.names = names
        self.info = info
        self.batch_size = batch_size
        self.group = group
        before = grads_before or [None] * len(params)
        self.accumulated = any(b is not None for b in before)
        after = grads_after or [held(p) for p in params]
        self.grads = [
            torch.zeros_like(p) if a is None else a if b is None else a - b
            for p, a, b in zip(params, after, before)
        ]
        if group is not None and self.accumulated and pass_grads:
            # torch.distributed with no_sync accumulation: the earlier micro-batches' gradients
            # were not averaged; this pass's global gradient is the engine's all-reduced one
            self.grads = [pass_grads[i].reshape(p.shape) if i in pass_grads else g for i, (p, g) in enumerate(zip(params, self.grads))]
        self._per_sample = per_sample
        self._diagonals = diagonals or {}
        self.noise = set(noise)
        """Indices of the parameters whose gradient is zero up to rounding (the engine's rules and autograd
        disagree on it beyond its own size: an attention key bias, a bias right before a BatchNorm)."""
        self._transforms = {t.key: t for t in transforms}
        self.subset = getattr(info, "subset", None)

    @property
    def samples(self):
        """``k``, the number of samples the per-sample transforms saw: ``B``, or the size of the
        subsample ``subset`` (``Cockpit(samples=k)``; then a quantity estimates its value, see
        ``cockpit_lite.subsample``)."""
        return self.batch_size if self.subset is None else len(self.subset)

    @cached_property
    def params_copy(self):
        """A copy of the parameters θ_t, made once per step and shared by the quantities that
        compare them with a later step's or record them (``UpdateSize``, ``Alpha``,
        ``Parameters``): one copy of the model, not one per quantity. Nobody may change it in place."""
        return [p.detach().clone() for p in self.params]

    @cached_property
    def grad_norms(self):
        """``‖g‖₂`` of every parameter (``cockpit_lite.utils.norms``: float32 or wider, accurate at
        any size; NaN/Inf propagate), shared by ``GradNorm``, ``GradPresence`` and the orchestrator's
        non-finite gradient check."""
        return norms(self.grads)

    @cached_property
    def centred_squares(self):
        """``Σ_n (g̃_{n,d} − g_d)²`` of every parameter and the parameters whose variance was lost in
        rounding (``cockpit_lite.engine.transforms.centred_squares``), shared by ``GradVariance``,
        ``MeanGSNR``, ``CABS`` and ``EarlyStopping``."""
        return _transforms.centred_squares(self)

    @cached_property
    def centred_totals(self):
        """``Σ_d M2_d`` of every parameter (``centred_squares``), one tensor ``[P]`` in parameter
        order, shared by ``GradVariance`` and ``CABS``."""
        return totals(self.centred_squares[0])

    @cached_property
    def grad_squared_norms(self):
        """``‖g‖²`` of every parameter (shared by the gradient tests)."""
        return list(totals(g**2 for g in self.grads))

    def rounding_level(self, terms, total=True):
        """The rounding level ``2 (u + √(D + B) u_acc) · terms`` of a difference of two terms of
        size ``terms`` (``[1 + P]``: the whole network's, then each parameter's; ``[P]`` without
        ``total``), below which the difference is not a measurement (``resolved``).

        Each term is a sum over the ``B`` samples of reductions over a tensor's ``D`` elements,
        stored in the dtype of ``terms`` (unit roundoff ``u``) and accumulated in it or, for
        narrower dtypes, in float32 (``u_acc``, as torch's reductions do): with independent
        rounding errors its relative error is about ``u + √(D + B) u_acc`` (the probabilistic
        bound of a chain of ``D + B`` additions, Higham & Mary 2019; tree and blocked reductions
        do better), and the difference carries both terms' errors.
        """
        sizes = tuple(p.numel() for p in self.params)
        return _level_factors(sizes, self.batch_size, bool(total), terms.dtype, terms.device) * terms

    def resolved(self, quantity, what, values, difference, terms, total=True):
        """``values`` with NaN where ``difference`` is lost in the rounding of the ``terms`` it
        cancels, and a flag for each: the rule of the quantities formed by such a cancellation
        (``NormTest``, ``InnerTest``, ``OrthoTest``, ``GradVariance``).

        Each statistic is a spread formed by cancellation: a difference of two terms of size
        ``terms`` that agree in their leading digits when the individual gradients are nearly the
        same (or nearly collinear), e.g. ``Σ_n ‖g̃_n‖² − B ‖g‖²``. Below its rounding level

            level = 2 (u + √(D + B) u_acc) · terms      (``rounding_level``)

        the difference is not a measurement (it comes out 0, negative, or rounding noise of the
        size of ``level``): ``difference < level`` is NaN with a flag naming the quantity, the
        parameter (or the whole network) and the numbers. So is a parameter whose gradient is zero up
        to rounding (``noise``: its spread and its norm are both noise, the level rule cannot tell). Strictly below: a tensor with no
        gradient (``terms = 0``) keeps its value, and where that value divides by its zero gradient
        (NaN) a flag says so. The elementwise variances of
        ``centred_squares`` are NaN on a negative element; the sign alone misses a spread that
        comes out 0 or positive noise (``OrthoTest`` 5.7e-5 against 3.2e-7; ``GradVariance``
        of a 4-element bias 0 against 0.056), which the level catches.

        Args:
            quantity: the quantity's name, for the flags.
            what: the cancelled difference, for the flags (its formula and what makes it vanish).
            values, difference, terms: tensors ``[1 + P]``: the whole network's, then each
                parameter's in order (``with_total``'s layout); ``[P]`` without ``total``.
            total: whether the first entry is the whole network's.

        Returns:
            ``(values, flags)``. One host sync, for the comparison.
        """
        level = self.rounding_level(terms, total)
        lost = difference < level
        zero = (terms == 0) & values.isnan()  # a statistic divided by ‖g‖ = 0
        if not self.noise and not bool((lost | zero).any()):
            return values, []
        noise = torch.zeros_like(lost)
        for index in self.noise:  # a gradient zero up to rounding: its spread and its norm are noise alike
            noise[index + total] = True
        names = ["the whole network"] * total + list(self.names)
        indices = lost.nonzero().reshape(-1).tolist()
        flags = [
            f"{quantity}: {what} of {names[index]} is lost "
            f"in the rounding in {difference.dtype}: {d:.3g} against a rounding level of {l:.3g}: NaN"
            for index, d, l in zip(indices, difference[lost].tolist(), level[lost].tolist())
        ] + [
            _noise_flag(quantity, names[index]) for index in (noise & ~lost).nonzero().reshape(-1).tolist()
        ] + [_zero_flag(quantity, names[index], self._frozen(index - total))
             for index in (zero & ~lost & ~noise).nonzero().reshape(-1).tolist()]
        return torch.where(lost | noise, torch.full_like(values, float("nan")), values), flags

    def without_noise(self, quantity, output):
        """A subsampled estimate's ``output`` (``cockpit_lite.subsample``) under the rules of ``resolved``
        that hold for an estimate: its value and standard error NaN, and a flag, for each parameter whose
        gradient is zero up to rounding (``noise``: the subsample's ratio of rounding noise is no estimate
        of anything), and a flag for a value that is NaN because the parameter's gradient is exactly 0
        (the estimate divides by ‖g‖ = 0). Layouts: ``value`` the whole network's and ``layers``
        (``meta["layers_se"]``), or ``value`` a list per parameter (``meta["se"]``). One host sync."""
        per_parameter, ses = ((output.layers, output.meta["layers_se"]) if output.layers is not None
                              else (output.value, output.meta["se"]))
        nan = float("nan")
        for index in sorted(self.noise):
            per_parameter[index], ses[index] = nan, nan
            output.flags.append(_noise_flag(quantity, self.names[index]))
        zero = (torch.stack(self.grad_squared_norms) == 0).nonzero().reshape(-1).tolist()
        output.flags += [_zero_flag(quantity, self.names[index], self._frozen(index)) for index in zero
                         if index not in self.noise and math.isnan(float(per_parameter[index]))]
        return output

    def _frozen(self, index):
        """Whether parameter ``index`` (``-1``: the whole network) no longer requires a gradient."""
        return index >= 0 and not self.params[index].requires_grad

    def per_sample(self, key):
        """Per-parameter values of the transform with ``key`` (see ``cockpit_lite.engine.transforms``).

        A parameter that took no part in the forward pass has zero individual
        gradients; its value is computed from those zeros.
        """
        values = []
        for index, param in enumerate(self.params):
            results = self._per_sample.get(index)
            if results is None:
                per_sample = PerSample.zeros(param, index, self.samples, batch_size=self.batch_size)
                results = _transforms.run([self._transforms[key]], per_sample)
            values.append(results[key])
        return values

    def curvature(self, name):
        """Per-parameter diagonal curvature: stored by BackPACK under ``name`` (detached), or the
        engine's ``ggn.Diagonal`` of the request ``name`` (``Needs.diagonals``; its error, if it
        failed, is raised here).

        A parameter that took no part in the forward pass has zero curvature.
        """
        if not isinstance(name, str):  # (of the ranks' mean loss already: ``cockpit_lite.curvature.ggn``)
            return self.diagonal(name).diagonal
        values = []
        for param in self.params:
            value = getattr(param, name, None)
            values.append(torch.zeros_like(param) if value is None else value.detach())
        if self.group is not None:  # the curvature of DDP's loss, the mean of the ranks' losses
            values = [v / self.group.world for v in self.group.sum(values)]
        return values

    def diagonal(self, request):
        """The engine's ``ggn.Diagonal`` of ``request`` (its flags, passes and estimate), or the
        error it failed with (raised)."""
        found = self._diagonals[request]
        if isinstance(found, Exception):
            raise found
        return found


def _noise_flag(quantity, name):
    return (
        f"{quantity}: the gradient of {name} is zero up to rounding (the engine's and autograd's sums of its "
        "individual gradients disagree beyond its own size: a bias the loss cannot see, such as an attention key "
        "bias or a bias right before a BatchNorm): its value would be rounding noise: NaN"
    )


def _zero_flag(quantity, name, frozen=False):
    if frozen:
        return f"{quantity}: {name} is frozen (requires_grad=False), its gradient 0: its value divides by ‖g‖ = 0: NaN"
    return (
        f"{quantity}: the gradient of {name} is exactly 0 at this step (no gradient reaches it: a layer this "
        "forward pass left out, a branch scaled by zero such as a residual block whose last BatchNorm is "
        "initialised to zero, an LSTM's reverse direction read only at its last position): its value divides "
        "by ‖g‖ = 0: NaN"
    )
