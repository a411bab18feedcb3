"""``Alpha``: where on the local 1-d loss parabola the optimizer's step landed."""

import functools
import itertools
import math

import numpy as np
import torch

from cockpit_lite import intervals, subsample
from cockpit_lite.optim import UpdatePredictor
from cockpit_lite.quantities.base import Needs, Output, Quantity
from cockpit_lite.engine.per_sample import at_least_float32
from cockpit_lite.engine.transforms import BatchDotDirection, dots_of_kept
from cockpit_lite.utils.norms import dot, gathered, gram
from cockpit_lite.utils.shards import group_of, local

DIFFERENCE_ELEMENTS = 1 << 20
"""Models of at most this many parameters (4 MiB in float32) have their update formed once
(beyond, one more copy of the model held from ``optimizer.step()`` to the next step)."""

KEEP_ELEMENTS = 1 << 22
"""At a subsampled start step, the most elements (16 MiB in float32) of the drawn samples'
individual gradients that α keeps from the backward pass to ``optimizer.step()`` beyond the
1-D parameters', to project them onto the real update there instead of predicting it."""

FINGERPRINT_GATHER = 1 << 16
"""``fingerprint``: parameters of at most this many elements are concatenated (a model's many
biases and norms, one sum for them all); larger ones are summed in place."""

PROBE_STEPS = 3
"""The first start steps of a run keep their individual gradients (within ``KEEP_ELEMENTS``) and
check the prediction against the real update: a recipe that changes the gradient before the step
from its first steps on (clipping under momentum or Adam, bf16 autocast, unscaling under Adam) keeps
them from then on, with no step lost; otherwise later start steps predict."""

PREDICTION_RTOL = {torch.float64: 1e-10}
"""Largest relative distance of an update from the predicted update's line (float64; 1e-4 for
float32 and narrower dtypes): the engine's gradient and autograd's differ by rounding only."""


class Alpha(Quantity):
    """Normalised step position α of the step from θ_t to θ_{t+1} (recorded under step t).

    Along the update ``d = θ_{t+1} − θ_t`` (length ``t = ‖d‖``) a quadratic
    ``q(x) = μ₀ + μ₁ x + μ₂ x²`` is fitted by maximum likelihood to four noisy
    observations: the losses ``f(0) = L_t``, ``f(t) = L_{t+1}`` with variances
    ``Var̂_n(ℓ_n)``, and the slopes ``f'(0)``, ``f'(t)`` (means of the individual
    slopes ``s_n = g̃_nᵀ d / ‖d‖`` at each end) with variances ``Var̂_n(s_n)``
    (unbiased; a zero variance is replaced by 1e-10, as in Cockpit). Then

        α = 2t / (−μ₁/μ₂) − 1,   and α = −1 for a concave fit (μ₂ < 0).

    α = 0: the step landed in the minimum of the parabola; α = 1: on the other side at
    the starting height; α < 0: short of the minimum; α > 1: overshooting.

    The slopes are those of ``info["loss"]`` itself: ``s_n = g̃_nᵀ d / (σ ‖d‖)`` with
    ``g̃_n`` the individual gradients of the loss backpropagated, unclipped, and
    ``σ = ∂(loss backpropagated) / ∂info["loss"]`` (a ``GradScaler``'s scale for
    ``scaler.scale(loss).backward()``, else 1); ``d`` is the real update, after whatever changed the gradient between
    ``backward`` and ``step`` (``clip_grad_norm_``, ``clip_grad_value_``, unscaling, a
    new learning rate). So ``mean_n s_n = gᵀd/‖d‖ = f'(0)`` exactly, and with clipping
    ``Var̂_n(s_n) = dᵀ Σ̂ d / ‖d‖²`` (``Σ̂`` the unbiased covariance of the unclipped
    ``g̃_n``) is the sampling variance of the loss's slope along the clipped step:
    clipping shortens or turns the step, it does not change the loss being fitted.

    Two-step quantity without extra passes. The individual slopes at θ_t are needed
    inside the backward pass, before ``d`` exists: they are projected onto the update
    predicted from the unchanged gradient by stepping a private copy of the optimizer
    (``cockpit_lite.optim``). The optimizer's step post-hook
    (``Optimizer.register_step_post_hook``, registered for that step only) reads the
    real update the moment the optimizer made it (also when ``optimizer.step(closure)``
    runs the backward pass itself, as Lightning does). The individual gradients of 1-D
    parameters (biases, normalisation scales: ``B ×`` their size) are kept at every start
    step and projected onto the real update there (``kept_always``: exact zeros of their
    gradient, an attention key bias, take the sign of rounding under Adam's first step, which no
    prediction matches); for the others it checks the prediction: one that
    is only rescaled (a new learning rate, ``clip_grad_norm_`` under plain SGD) leaves
    the slopes exact. One that turned (clipping under Adam/AdamW or momentum,
    ``clip_grad_value_``, a ``GradScaler``'s unscaling under Adam, bf16 autocast, an edited
    gradient, an optimizer that is not element-wise) needs the individual gradients of the
    start step kept from the backward pass to the post-hook (Linear and Embedding layers as
    their factors, the size of the layer's activations; other parameters ``B ×`` their
    size) and projected onto the real update there: exact for every change of the
    gradient, at that memory. The first ``PROBE_STEPS`` start steps of a run keep them
    (within ``KEEP_ELEMENTS``) and predict their update as well, to check the prediction
    against the real update: a recipe that turns the update from its start keeps them from then on, with no
    step lost; one whose predictions held predicts from then on, and a turn that appears
    later makes that step NaN with a flag and α keeps them from the next start step on. Under
    DDP every rank keeps its samples' individual gradients of the same parameters (at a probe
    step those that fit counted densely, as the rank's share ``B / W`` of the batch times the
    parameter's size, alike on every rank, where one process counts the form they came in) and
    projects them onto the update in the step post-hook, where one all-gather puts the ranks'
    slopes together in rank order, at every start step (ranks that kept different parameters,
    which only a bug would make, give NaN with a flag, never a sum of different parameters'
    slopes). On a model sharded by FSDP2 nothing is kept, and such steps stay NaN. At a
    subsampled start step (below) α keeps, besides the 1-D ones, the drawn samples'
    individual gradients of every parameter while they hold at most ``KEEP_ELEMENTS`` elements
    in all (a small model's: all of them) and predicts only the others' updates. At step t+1
    the update ``θ_{t+1} − θ_t`` must be the one the optimizer made (parameters changed after
    the step give NaN and a flag). An update of zero length also gives NaN (Cockpit: −1). A
    parameter that moved in the step and was then frozen (``requires_grad_(False)``) has no
    gradient at step t+1: NaN and a flag naming it. A frozen parameter without ``.grad``,
    which torch's optimizers skip, has a predicted update of zero. Step numbers must be
    consecutive. Needs ``info["optimizer"]`` and ``info["loss"]``; individual
    losses are derived. There is no per-layer α: the losses belong to the whole network.

    Subsampled (``Cockpit(samples=k)``, ``cockpit_lite.subsample``): at an end drawn from
    ``k`` of its ``B`` samples the mean slope is exact, ``gᵀd / (σ‖d‖)`` with autograd's
    gradient ``g`` (at the start step a copy of it, in its dtype, unclipped, kept until the
    optimizer's step post-hook has projected it onto ``d``), and the slopes' variance is the
    subsample's (unbiased for the batch's); the losses' mean and variance are the whole
    batch's. α, a smooth function of them, is consistent; its standard error in the ``meta``
    is the jackknife's over the subsample (each end's samples left out one at a time; the two
    ends' draws are independent, so their variances add), with ``"df"`` the Welch-Satterthwaite
    degrees of freedom of that sum (``k − 1`` for one drawn end). α depends on the drawn samples
    only through the slopes' variances, and a variance from a few samples is skewed to the right
    (a draw without the largest slopes is low, and so is its jackknife error): a symmetric
    interval ``α ± t·se`` misses far more often than its coverage says. The ``meta`` therefore
    records ``"interval"``, the range of α over the box of each drawn end's variance times
    ``exp(0, ±q·se(log variance))`` (``q`` the t-quantile of ``k − 1`` degrees at the coverage
    ``cockpit_lite.intervals.COVERAGE``, recorded as ``"coverage"``; the jackknife standard error
    of the log of the leave-one-out variances), from 3 or 9 more fits. A leave-one-out variance of
    exactly 0 (the rest of the drawn slopes equal: a duplicated sample among 3) has no log; that
    end's spread is then infinite, its box the limits of its variance from 0 to ∞ (an infinite
    variance drops the slope's observation; a corner of both ends' infinite variances, two losses
    for three coefficients, is NaN, and so is then the interval).
    """

    TIER = 1  # (overhead budget: per-sample)

    SUBSAMPLE = True

    STATE = ("_start", "_keep", "_probed")  # the pending step's half of the fit (resumed runs finish it); whether to keep

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._start = None
        self._pending = None
        self._seed = None
        self._keep = None  # keep the start steps' individual gradients until optimizer.step(); None: undecided
        self._probed = 0  # start steps probed so far (``PROBE_STEPS``)
        self._sharded = False  # FSDP2: nothing is kept
        self._ranks = None  # DDP: the ``Group`` whose ranks' slopes of the kept parameters ``_gather_kept`` joins
        self._sizes = None
        self._hook = None

    def bind(self, cockpit):
        group = cockpit.group
        self._sharded = group is not None and group.sharded
        self._ranks = group if group is not None and not group.sharded else None
        self._sizes = lambda: cockpit.engine.sizes  # (DDP: every rank's number of samples at the step)

    def unbind(self):
        self._remove_hook()

    def needs(self, step, info):
        self._remove_hook()  # the last start step's, which has fired (or never will)
        start = self.is_due(step)
        end = self._start is not None and self._start["step"] == step - 1
        if not (start or end):
            self._start = None
            return None
        loss = info.require("loss", self.name)
        info.require("individual_losses", self.name)
        seed = self._seed = {}
        if loss.requires_grad:

            def seed_of_backward(grad):  # σ: the gradient arriving at info["loss"]
                seed["value"] = grad.detach()

            loss.register_hook(seed_of_backward)
        transforms = []
        if end:
            self._take_update(self._start)
            update = self._start["update"]
            transforms.append(
                BatchDotDirection(("Alpha", "end"), lambda per_sample: update[per_sample.index], reads_grad=False)
            )
        if start:
            optimizer = info.require("optimizer", self.name)
            predict = UpdatePredictor(optimizer)
            predicted = {}
            kept = None if self._sharded else {}
            self._pending = {"optimizer": optimizer, "predicted": predicted, "kept": kept}

            def predicted_update(per_sample):
                if per_sample.index not in predicted:  # once per parameter (chunks of samples share it)
                    param = per_sample.param
                    frozen = not param.requires_grad and param.grad is None  # torch's optimizers skip it
                    predicted[per_sample.index] = (param.new_zeros(param.numel()) if frozen
                                                   else predict(param, per_sample.optimizer_grad))
                return predicted[per_sample.index]

            probing = self._keep is None and kept is not None and self._probed < PROBE_STEPS
            self._pending["probing"] = probing
            keep_if = None if self._keep else _keeps(info, predicted_update if probing else None,
                                                     dense=self._ranks is not None)
            transforms.append(BatchDotDirection(("Alpha", "start"), predicted_update, keep=kept, keep_if=keep_if))
        return Needs(transforms=tuple(transforms))

    def observes(self, step):
        return self.is_due(step) or self.is_due(step - 1)

    def compute(self, step, data):
        self._remove_hook()
        output = None
        losses = data.info.require("individual_losses", self.name)
        loss = float(data.info.require("loss", self.name).detach())
        seed = self._seed.get("value")
        seed = 1.0 if seed is None else float(seed)
        if self._start is not None and self._start["step"] == step - 1:
            output = self._finish(step, data, loss, losses, seed)
        self._start = None
        if self.is_due(step):
            pending, self._pending = self._pending, None  # (its predicted update lives in _start until the step)
            self._start = {
                "step": step,
                "params": data.params,
                "params_before": data.params_copy,  # shared with the other quantities of the step
                "f": loss,
                "var_f": _variance(losses),
                "seed": seed,
                "backward_dots": data.per_sample(("Alpha", "start")),  # onto the update predicted in backward
                "subsampled": (data.samples, data.batch_size) if data.subset is not None else None,
                # the exact mean slope's gradient, until the post-hook has projected it onto d
                "grad": [g.detach().clone() for g in data.grads] if data.subset is not None else None,
                "grad_dot": None,  # gᵀd
                "backward_predicted": [pending["predicted"].get(i) for i in range(len(data.params))],
                "kept": pending["kept"],
                "stepped": None,  # the parameters' bits right after optimizer.step() (its step post-hook)
                "moved": False,  # whether the parameters changed between optimizer.step() and step t+1
                "dots": None,
                "direction_norm": None,
                "edited": False,
                "failure": None,
                "no_learning_rate": all(_is_zero(group.get("lr")) for group in pending["optimizer"].param_groups),
                "probing": pending["probing"],
                "sizes": self._sizes() if self._ranks is not None else None,
            }
            self._hook = pending["optimizer"].register_step_post_hook(self._after_step)
        return output

    def _after_step(self, optimizer, args, kwargs):
        """Step post-hook of a start step (once): the update ``d`` the optimizer made.

        ``g̃_nᵀ d`` summed over the parameters: the kept ones' individual gradients projected
        onto ``d`` here, the others' projections made in backward, rescaled, if their part of
        ``d`` lies on the line of their predicted update (else the step is marked edited and
        the following start steps keep every individual gradient). What only this needs (the
        predicted update, a subsampled step's copy of ``g``) is released here. The handle is
        removed by the next ``needs`` or ``compute`` (not here: torch is iterating over the hooks).
        """
        start = self._start
        if start is None or start["stepped"] is not None:
            return
        update = _Difference(start["params"], start["params_before"])
        start["stepped"] = fingerprint(start["params"])
        predicted, start["backward_predicted"] = start["backward_predicted"], None
        grad, start["grad"] = start["grad"], None
        kept, start["kept"] = start["kept"], {}
        kept = kept if kept is not None else {}
        try:  # never break the user's optimizer step
            self._place(start, update, predicted, grad, kept)
        except Exception as error:
            start["failure"] = f"Alpha: placing the step failed: {error!r}"
        if self._ranks is not None:  # on every rank, whatever happened above: the others wait for it
            self._gather_kept(start)

    def _place(self, start, update, predicted, grad, kept):
        """``_after_step``'s sums: ``gᵀd``, ``‖d‖`` and the individual slopes' ``g̃_nᵀ d`` into ``start``, or
        ``start["edited"]`` where the rest's update is off the line of its prediction; on a probe step,
        whether later steps keep."""
        dots = start["backward_dots"]
        if start["probing"]:  # the kept parameters' predictions: would they have matched the update?
            self._probed += 1
            checked = [i for i in sorted(kept) if not kept_always(start["params"][i])]
            if not _predicted_on_line(checked, predicted, update):
                self._keep = not self._sharded
            elif self._probed >= PROBE_STEPS:
                self._keep = False
        rest = [i for i in range(len(update)) if i not in kept]  # projected onto the prediction in backward
        # one pass over each parameter: ‖d‖², gᵀd and, for the rest, their predicted update's ‖u‖² and uᵀd
        with_grad = (lambda i: (grad[i],)) if grad is not None else (lambda i: ())
        rest_sums = gram((update[i], predicted[i]) + with_grad(i) for i in rest) if rest else None
        kept_sums = gram((update[i],) + with_grad(i) for i in sorted(kept)) if kept else None
        if grad is not None:
            start["grad_dot"] = sum(g[0][-1] for g in (rest_sums, kept_sums) if g is not None)
        scale = 1.0  # the rest's real update is scale × its predicted one
        if rest:
            scale = _on_line([predicted[i] for i in rest], [update[i] for i in rest],
                             (rest_sums[1][1], rest_sums[0][1], rest_sums[0][0]))
            if scale is None:
                start["edited"] = True
                self._keep = not self._sharded
                return
        start["direction_norm"] = math.sqrt(sum(g[0][0] for g in (rest_sums, kept_sums) if g is not None))
        # each kept parameter's individual gradients are released once projected; adding 0 · the
        # backward's dots makes a parameter the engine failed NaN
        indices = sorted(kept)
        projected = [dots_of_kept(kept.pop(i), update[i]) for i in indices]
        rest_dots = [scale * dots[i] for i in rest] + [0 * dots[i] for i in indices]
        if self._ranks is None:
            start["dots"] = sum(projected + rest_dots)
            return
        start["dots"] = sum(rest_dots)  # the ranks' samples', gathered in backward; the kept ones' in ``_gather_kept``
        start["kept_dots"] = (sum(projected) if projected else None, (len(indices), sum((i + 1) ** 2 for i in indices)))

    def _gather_kept(self, start):
        """DDP: every rank's slopes ``g̃_nᵀ d`` of the parameters it kept (its samples', from ``_place``)
        joined in rank order and added to ``start["dots"]``: one all-gather on every rank at each start
        step's post-hook, whatever ``_place`` did (a rank that skipped it would leave the others waiting).
        Each rank sends with them which parameters it kept; ranks that kept different ones, or a rank whose
        slopes are not one per sample of its part of the batch, make the step NaN with a flag (never a sum of
        different parameters' slopes, nor slopes padded with zeros)."""
        mine, signature = start.pop("kept_dots", (None, (-1, -1)))
        sizes, rank = start["sizes"], self._ranks.rank
        if sizes is None:  # (the engine formed no individual gradients in this run yet, on any rank: none kept)
            return
        unjoinable = ("Alpha: the ranks kept the individual gradients of different parameters (or of other samples "
                      "than the step's) until optimizer.step(), so their slopes cannot be joined")
        if mine is not None and mine.numel() != sizes[rank]:
            start["failure"] = start["failure"] or unjoinable
            mine, signature = None, (-2, -2)
        if mine is None:
            mine = torch.zeros(sizes[rank], dtype=torch.float64)
        sent = torch.cat([mine.detach().to(torch.float64).cpu().reshape(-1),
                          torch.tensor(signature, dtype=torch.float64)])
        joined = self._ranks.gather([sent], [size + 2 for size in sizes])[0]
        try:  # never break the user's optimizer step (after the collective: every rank took part)
            parts = joined.split([size + 2 for size in sizes])
            if len({tuple(part[-2:].tolist()) for part in parts}) > 1:
                start["failure"] = start["failure"] or unjoinable
            elif signature[0] > 0 and start["failure"] is None and not start["edited"]:
                dots = start["dots"]
                start["dots"] = dots + torch.cat([part[:-2] for part in parts]).to(dots.dtype).to(dots.device)
        except Exception as error:
            start["failure"] = f"Alpha: joining the ranks' slopes failed: {error!r}"

    def _take_update(self, start):
        """At step t+1: ``d = θ_{t+1} − θ_t`` (``_Difference``: formed a parameter at a time when
        read, from θ_t's copy, which ``UpdateSize`` shares), whether it is the update
        ``optimizer.step()`` made (``moved``: the parameters' bits changed after it), and its
        length (the post-hook's if they did not: the same bits)."""
        start["update"] = update = _Difference(start["params"], start["params_before"])
        if start["stepped"] is not None:
            start["moved"] = fingerprint(start["params"]) != start["stepped"]
        same = start["stepped"] is not None and not start["moved"] and start["direction_norm"] is not None
        start["length"] = start["direction_norm"] if same else math.sqrt(dot(update))

    def _remove_hook(self):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _finish(self, step, data, loss, losses, seed):
        start = self._start
        update, t = start["update"], start["length"]
        flags = []
        stepped = start["stepped"]
        if not math.isfinite(t):
            flags.append("Alpha: the update is not finite (the parameters diverged)")
        elif t == 0.0:
            flags.append("Alpha: the parameters did not change between the two steps"
                         + (" (the learning rate was 0, as at the first step of a warm-up from 0: no step to place)"
                            if start.get("no_learning_rate") else ""))
        elif stepped is None:
            flags.append("Alpha: the parameters changed without a step of info['optimizer'] in between")
        elif start["failure"] is not None:
            flags.append(start["failure"])
        elif start["edited"]:
            flags.append(
                "Alpha: the gradient was changed between backward and optimizer.step() so that the update "
                "turned (clipping under Adam, element-wise clipping, edited gradients); "
                + ("on a model sharded by FSDP2 α is NaN at such steps" if self._sharded else
                   "from the next tracked step on α keeps the individual gradients until optimizer.step(), "
                   "which makes it exact")
            )
        elif start["moved"]:
            flags.append("Alpha: the parameters changed after optimizer.step() (the update is not the optimizer's; "
                         "if another optimizer steps them too, pass all of them: info['optimizer'] = [optimizer_a, "
                         "optimizer_b])")
        frozen = [data.names[i] for i, p in enumerate(data.params) if not p.requires_grad and bool(update[i].any())]
        if frozen and math.isfinite(t):
            flags.append(f"Alpha: {', '.join(frozen)} moved in the step and then stopped requiring a gradient "
                         "(frozen), so the slope at the step's end has no gradient of it: α of this step is "
                         "not defined (nor at a later step in which it still moves, e.g. by Adam's momentum "
                         "on a zeroed gradient; once it stays put it no longer counts)")
        if losses.numel() < 2:
            flags.append("Alpha: a batch of one sample has no variance of the losses and slopes, which the fit needs")
        elif not (math.isfinite(start["var_f"]) and math.isfinite(_variance(losses))):
            flags.append("Alpha: the individual losses are not finite at one end of the step, so neither is "
                         "their variance, which the fit needs")
        if flags:
            return Output(float("nan"), step=step - 1, flags=flags)
        slopes = [
            start["dots"] / (start["direction_norm"] * start["seed"]),
            sum(data.per_sample(("Alpha", "end"))) / (t * seed),
        ]
        fs, var_fs = [start["f"], loss], [start["var_f"], _variance(losses)]
        exact_means = [  # a subsampled end's mean slope is gᵀd / (σ‖d‖), from the exact gradient
            None if start.get("grad_dot") is None else start["grad_dot"] / (t * start["seed"]),
            None if data.subset is None else dot(data.grads, update) / (t * seed),
        ]

        def alpha(means, variances):  # of the slopes at each end: [..., 2]
            means = np.where([m is None for m in exact_means], means, [m or 0.0 for m in exact_means])
            return alpha_from_fit(fit_quadratic(t, fs, means, var_fs, variances), t)

        stats = [(float(s.mean()), _variance(s)) for s in slopes]
        ends = [start.get("subsampled"), (data.samples, data.batch_size) if data.subset is not None else None]
        # row 0: the fit of the step; then, for each drawn end, one row per sample left out there; then
        # the corners of the interval's box: each drawn end's variance times exp(0, ±q·se(log variance))
        means, variances = [np.array([[m for m, _ in stats]])], [np.array([[v for _, v in stats]])]
        spreads = [0.0, 0.0]
        for end, drawn in enumerate(ends):
            if drawn is not None:
                means.append(np.repeat(means[0], drawn[0], axis=0))
                variances.append(np.repeat(variances[0], drawn[0], axis=0))
                means[-1][:, end], variances[-1][:, end] = _leave_one_out(slopes[end].double().cpu().numpy())
                left_out = variances[-1][:, end]
                if (left_out == 0).any():  # no log: the limit, that end's variance from 0 to ∞
                    spreads[end] = math.inf
                else:  # (two passes: never below 0; NaN for k < 3, which np.log passes on silently)
                    q = intervals.quantile(drawn[0] - 1, intervals.COVERAGE)
                    spreads[end] = q * subsample.jackknife_se(np.log(left_out).tolist(), drawn[1])
        box = np.exp(np.array(list(itertools.product(*[(-s, 0.0, s) if s else (0.0,) for s in spreads]))))
        if any(ends):
            means.append(np.repeat(means[0], len(box), axis=0))
            # (an infinite corner is ∞ whatever the end's variance, 0 included: all its drawn slopes equal)
            variances.append(np.where(np.isinf(box), np.inf, variances[0] * np.nan_to_num(box, posinf=1.0)))
        means, variances = np.concatenate(means), np.concatenate(variances)
        fitted = alpha(means, variances)
        value = float(fitted[0])
        if not any(ends):
            return Output(value, step=step - 1)
        parts, row = [], 1  # per drawn end: (the jackknife's variance of α, its degrees of freedom)
        for drawn in filter(None, ends):
            parts.append((subsample.jackknife_se(fitted[row : row + drawn[0]].tolist(), drawn[1]) ** 2, drawn[0] - 1))
            row += drawn[0]
        variance = sum(v for v, _ in parts)
        df = variance**2 / sum(v**2 / d for v, d in parts) if variance > 0 else min(d for _, d in parts)
        corners = fitted[row:]
        held, size = next(e for e in ends if e)
        meta = subsample.meta(held, size, math.sqrt(variance), df=df)
        ends_of = [float(corners.min()), float(corners.max())] if np.isfinite(corners).all() else [math.nan] * 2
        meta.update(interval=ends_of, coverage=intervals.COVERAGE)
        return Output(value, step=step - 1, meta=meta)


class _Difference:
    """``[θ_i − θ0_i]`` (each in its parameter's shape), a sequence whose items are formed when read (one
    parameter's difference at a time, never a copy of the whole model), or once, up front, if
    all of them hold at most ``DIFFERENCE_ELEMENTS`` elements (a small model: each read would
    cost more calls than it saves memory)."""

    def __init__(self, params, before):
        self._params, self._before = params, before
        self._formed = None
        if sum(p.numel() for p in params) <= DIFFERENCE_ELEMENTS:
            self._formed = [self[i] for i in range(len(params))]

    def __len__(self):
        return len(self._params)

    def __getitem__(self, i):
        if self._formed is not None:
            return self._formed[i]
        return self._params[i].detach() - self._before[i]  # (FSDP2: a DTensor, the rank's rows)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def fingerprint(params):
    """The parameters' bits, summed: for the parameters of each dtype, concatenated in order
    (``utils.norms.gathered``), ``(Σ_j b_j, Σ_j (j+1) b_j)`` of the elements' bit patterns
    ``b_j`` read as integers of their width (16-bit ones widened to 32), in the wrapping
    arithmetic of that width (modular sums: the same in any order or thread count). Any
    change of one element changes the first (by a non-zero difference of two patterns, less
    than the modulus); a permutation, almost always the second; a change that leaves both
    equal has to be constructed. A tensor is read as rows of ``R = FINGERPRINT_ROW`` elements:
    ``Σ_j (j+1) b_j = R·Σ_r r·rows_r + Σ_c (c+1)·columns_c`` from its row and column sums, two
    passes of the integers' own reductions and no temporary the size of the tensor. Parameters
    sharded over the ranks (FSDP2): every rank's sums of its rows, gathered."""
    groups = {}
    for param in params:
        groups.setdefault(param.dtype, []).append(local(param.detach()))
    sums = []
    for dtype, tensors in groups.items():
        total = weighted = offset = 0
        for (flat,) in gathered(((t,) for t in tensors), FINGERPRINT_GATHER):
            if flat.is_floating_point():
                flat = flat.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])
            if flat.dtype not in (torch.int32, torch.int64):
                flat = flat.to(torch.int32)
            piece_total, piece_weighted = _bit_sums(flat)
            total += piece_total
            weighted += piece_weighted + offset * piece_total
            offset += flat.numel()
        sums.append((str(dtype), total, weighted))
    group = group_of(params)
    if group is not None:
        ranks = [None] * torch.distributed.get_world_size(group)
        torch.distributed.all_gather_object(ranks, sums, group=group)
        return ranks
    return sums


FINGERPRINT_ROW = 512
"""``fingerprint``: elements per row of a tensor (its row sums ``[n / 512]``, its column sums ``[512]``)."""


def _bit_sums(bits):
    """``(Σ_j b_j, Σ_j (j+1) b_j)`` of a 1-D integer tensor (wrapping in its dtype, then in int64):
    of its row sums, column sums and tail (what the rows leave) against ``_bit_weights``."""
    rows = bits.numel() // FINGERPRINT_ROW
    whole = bits[: rows * FINGERPRINT_ROW].view(rows, FINGERPRINT_ROW)
    sums = torch.cat([whole.sum(1, dtype=bits.dtype), whole.sum(0, dtype=bits.dtype), bits[rows * FINGERPRINT_ROW :]])
    total, weighted = (sums.to(torch.int64) * _bit_weights(rows, sums.numel(), bits.device)).sum(1).tolist()
    return total, weighted


@functools.lru_cache(maxsize=64)
def _bit_weights(rows, size, device):
    """``[2, size]`` int64: what ``_bit_sums`` multiplies ``[row sums | column sums | tail]`` by,
    ``[0 … | 1 … | 1 …]`` for the total (the column sums add up to the rows') and
    ``[R·r … | c + 1 … | R·rows + i + 1 …]`` for the positions' sum (``R = FINGERPRINT_ROW``;
    without a whole row the column sums are zeros)."""
    width = FINGERPRINT_ROW
    ones = torch.ones(size - rows, dtype=torch.int64, device=device)
    positions = torch.cat([
        torch.arange(rows, dtype=torch.int64, device=device) * width,
        torch.arange(1, width + 1, dtype=torch.int64, device=device),
        torch.arange(rows * width + 1, rows * width + 1 + size - rows - width, dtype=torch.int64, device=device),
    ])
    return torch.stack([torch.cat([ones.new_zeros(rows), ones]), positions])


def _keeps(info, probe=None, dense=False):
    """``keep_if`` of a start step that does not keep everything: the 1-D parameters
    (``kept_always``) and, at a subsampled step or a probe step (``probe``, a function predicting a
    parameter's update: the kept parameters' predictions are checked against the real update), the
    others in the order the backward pass forms them while the individual gradients kept so far
    (the drawn samples' at a subsampled step), in the form they came in, hold at most
    ``KEEP_ELEMENTS`` elements (decided on a parameter's first chunk of samples, for all its
    samples from that chunk's share). ``dense``: counted as the parameter's size times ``B``
    (``PerSample.batch_size``; under DDP a rank's share ``B / W``) instead, a bound that does not depend on
    the rank's samples: every rank keeps the same parameters (an embedding's rows, a sequence's length,
    the form they came in, may differ between the ranks)."""
    subset = getattr(info, "subset", None)
    room = [KEEP_ELEMENTS]
    decided = {}

    def keeps(per_sample):
        index = per_sample.index
        if index not in decided:
            decided[index] = kept_always(per_sample.param)
            if not decided[index] and (subset is not None or probe is not None):
                samples = len(subset) if subset is not None else per_sample.batch_size
                held = (per_sample.param.numel() * samples if dense
                        else per_sample.held_elements() * samples // per_sample.num_samples)
                decided[index] = held <= room[0]
                room[0] -= held if decided[index] else 0
                if decided[index] and probe is not None:
                    probe(per_sample)
        return decided[index]

    return keeps


def kept_always(param):
    """Whether a start step keeps ``param``'s individual gradients until ``optimizer.step()``
    whatever the prediction: 1-D parameters (biases, normalisation scales; ``B ×`` their size,
    small). Exact zeros of a gradient (an attention key bias, which the softmax cannot see; a
    bias before BatchNorm) take the sign of their rounding, which differs between the engine's
    gradient and autograd's, and Adam's first update there is about ± the learning rate: no
    prediction can match it, their projection onto the real update can."""
    return param.dim() <= 1


def _predicted_on_line(checked, predicted, update):
    """Whether the update of the parameters ``checked`` (indices) lies on the line of their predicted
    update (a probe step: whether start steps may predict instead of keeping)."""
    if any(predicted[i] is None for i in checked):
        return False
    if not checked:
        return True
    sums = gram((update[i], predicted[i]) for i in checked)
    return _on_line([predicted[i] for i in checked], [update[i] for i in checked],
                    (sums[1][1], sums[0][1], sums[0][0])) is not None


def _on_line(predicted, real, sums):
    """``c`` with ``real ≈ c · predicted``, ``c > 0``, up to ``PREDICTION_RTOL`` of ``‖real‖``;
    ``None`` if there is no such ``c``.

    ``predicted`` and ``real`` are lists of tensors (one per parameter; ``[D_i]`` or the
    parameter's shape), taken as one vector each; ``sums = (‖predicted‖², predictedᵀreal,
    ‖real‖²)`` in float64 (``utils.norms.gram``: torch's float32 ``dot`` of every parameter of a
    13M-parameter GPT is off by 5·10⁻⁴, more than the tolerance: every step looked turned). Then
    ``c = predictedᵀreal / ‖predicted‖²`` and the squared distance ``‖real − c·predicted‖²`` is
    ``‖real‖² − c·predictedᵀreal`` where that difference of sums cannot be off by more than a
    tenth of the tolerance: float32 or narrower tensors (their products are exact in float64, and
    the float64 sums of ``n`` of them are off by at most ``n·2⁻⁵³`` of ``‖real‖²`` each) with
    ``4n·2⁻⁵³ ≤ rtol²/10``; else (float64 tensors, large models) it is the residual's own sum,
    one more pass, one tensor at a time (never a copy of the whole model)."""
    rtol = max(PREDICTION_RTOL.get(p.dtype, 1e-4) for p in predicted)
    squared, cross, length = sums
    if squared == 0.0 or not cross > 0:
        return None
    scale = cross / squared
    narrow = all(t.dtype in (torch.float32, torch.float16, torch.bfloat16) for t in (*predicted, *real))
    if narrow and 4 * sum(p.numel() for p in predicted) * 2.0**-53 <= rtol**2 / 10:
        distance = max(length - scale * cross, 0.0)
    else:
        distance = dot(at_least_float32(r) - scale * at_least_float32(p) for p, r in gathered(zip(predicted, real)))
    return scale if distance <= rtol**2 * length else None


def fit_quadratic(t, fs, dfs, var_fs, var_dfs):
    """Maximum-likelihood quadratic ``μ₀ + μ₁ x + μ₂ x²`` through noisy values and slopes at 0 and t.

    Observations ``y = (f(0), f(t), f'(0), f'(t))`` with independent Gaussian noise of
    variances ``Λ = diag(var_fs + var_dfs)``; rows of ``Φ`` map μ to them. Then
    ``μ = (Φ Λ⁻¹ Φᵀ)⁻¹ Φ Λ⁻¹ y``, solved as the least squares of ``Λ^(−1/2) Φᵀ μ ≈ Λ^(−1/2) y`` by
    QR, the rows ordered from the most precise (the normal equations square the condition number: a
    slope's variance 1e-16 against the losses' 1e-2 put μ 4% off). A variance below
    ``RELATIVE_VARIANCE_FLOOR`` times the third smallest of its fit is raised to that: the
    observation is then a constraint to 1e-12 (float64 cannot resolve weights further apart), and
    a variance far above the others still drops its observation.
    ``dfs`` and ``var_dfs`` may have leading axes (``[..., 2]``: several fits at once, e.g. a
    jackknife's); μ then has shape ``[..., 3]``. An infinite variance drops its observation; a fit
    left with fewer than three observations (both slopes dropped: two losses for three coefficients)
    is NaN, the others their own.
    """
    eps = 1e-10
    dfs, var_dfs = np.asarray(dfs, dtype=float), np.asarray(var_dfs, dtype=float)
    shape = np.broadcast_shapes(dfs.shape, var_dfs.shape)[:-1] + (2,)

    def joined(values, slopes):
        return np.concatenate([np.broadcast_to(np.asarray(values, dtype=float), shape),
                               np.broadcast_to(slopes, shape)], -1)

    variances = joined(var_fs, var_dfs)
    variances = np.where(variances != 0, variances, eps)
    # three observations determine the quadratic: one far more precise than the third most precise is a constraint
    variances = np.maximum(variances, RELATIVE_VARIANCE_FLOOR * np.sort(variances, -1)[..., 2:3])
    # any three of the four rows of Φ are independent (t > 0): fewer left determine no quadratic
    dropped = np.isinf(variances).sum(-1) > 1
    scale = 1 / np.sqrt(np.where(dropped[..., None], 1.0, variances))  # Λ^(−1/2)
    phi = np.array([[1.0, 0.0, 0.0], [1.0, t, t**2], [0.0, 1.0, 0.0], [0.0, 1.0, 2 * t]])
    rows = np.argsort(-scale, -1)[..., None]  # the most precise first: Householder QR is then accurate row by row
    design = np.take_along_axis(phi * scale[..., None], rows, -2)
    observed = np.take_along_axis((joined(fs, dfs) * scale)[..., None], rows, -2)
    q, r = np.linalg.qr(design)
    mu = np.linalg.solve(r, np.swapaxes(q, -1, -2) @ observed)[..., 0]
    return np.where(dropped[..., None], np.nan, mu)


RELATIVE_VARIANCE_FLOOR = 1e-12
"""``fit_quadratic``: the smallest variance of an observation relative to the third smallest of its fit."""


def alpha_from_fit(mu, t):
    """``α = 2t / (−μ₁/μ₂) − 1``; −1 for a concave fit; NaN for a fit that is not finite (``mu`` of
    shape ``[..., 3]``: an array of α)."""
    mu = np.asarray(mu, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = 2 * t / (-mu[..., 1] / mu[..., 2]) - 1
    alpha = np.where(mu[..., 2] < 0, -1.0, alpha)
    alpha = np.where(np.isfinite(mu).all(-1), alpha, np.nan)
    return float(alpha) if alpha.ndim == 0 else alpha


def _leave_one_out(values):
    """``(means, unbiased variances)`` of ``values`` without each one in turn, ``[k]`` each: each of the
    ``k`` rests in two passes (``[k, k − 1]``; a closed form from the sums of squares cancels: off
    where the variance is small against the mean², and not 0 where the rest are equal)."""
    k = len(values)
    if k < 3:
        return np.full(k, np.nan), np.full(k, np.nan)
    rests = np.broadcast_to(values, (k, k))[~np.eye(k, dtype=bool)].reshape(k, k - 1)
    return rests.mean(1), rests.var(1, ddof=1)


def _is_zero(learning_rate):
    """Whether a parameter group's learning rate is 0 (``False`` for none, or one that is no number)."""
    try:
        return float(learning_rate) == 0.0
    except (TypeError, ValueError, RuntimeError):
        return False


def _variance(values):
    """The unbiased variance of the samples' values; NaN (no warning) for fewer than two."""
    return float(values.var()) if values.numel() > 1 else float("nan")
