"""``Alpha``: where on the local 1-d loss parabola the optimizer's step landed."""

import math
import warnings

import numpy as np
import torch

from cockpit_lite.optim import UpdatePredictor
from cockpit_lite.quantities.base import Needs, Output, Quantity
from cockpit_lite.transforms import BatchDotDirection

PREDICTION_RTOL = 1e-4
"""Largest relative distance of the real update from the predicted update's line."""


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

    Two-step quantity without extra passes. At step t the individual slopes are
    projected inside the backward pass onto the *predicted* update (the optimizer
    is stepped on a private copy, ``cockpit_lite.optim``); at step t+1 they are
    projected onto the real update and the prediction is checked: if the real
    update is not parallel to it (e.g. a scheduler or non-uniform gradient clipping
    between ``backward`` and ``step``), α is NaN and the step is flagged. An update of
    zero length also gives NaN (Cockpit: −1). Step numbers must be consecutive.
    Needs ``info["optimizer"]`` and ``info["loss"]``; individual losses are derived.
    There is no per-layer α: the losses belong to the whole network.
    """

    STATE = ("_start",)  # the pending step's half of the fit (resumed runs finish it)

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._start = None
        self._pending = None

    def needs(self, step, info):
        start = self.is_due(step)
        end = self._start is not None and self._start["step"] == step - 1
        if not (start or end):
            self._start = None
            return None
        info.require("loss", self.name)
        info.require("individual_losses", self.name)
        transforms = []
        if end:
            update = self._start["update"] = [
                p.detach() - p0 for p, p0 in zip(self._start["params"], self._start["params_before"])
            ]
            transforms.append(
                BatchDotDirection(("Alpha", "end"), lambda per_sample: update[per_sample.index])
            )
        if start:
            predict = UpdatePredictor(info.require("optimizer", self.name))
            pending = self._pending = {}

            def predicted_update(per_sample):
                if per_sample.index not in pending:  # once per parameter (chunks of samples share it)
                    pending[per_sample.index] = predict(per_sample.param, per_sample.optimizer_grad)
                return pending[per_sample.index]

            transforms.append(BatchDotDirection(("Alpha", "start"), predicted_update))
        return Needs(transforms=tuple(transforms))

    def observes(self, step):
        return self.is_due(step) or self.is_due(step - 1)

    def compute(self, step, data):
        output = None
        losses = data.info.require("individual_losses", self.name)
        loss = float(data.info.require("loss", self.name).detach())
        if self._start is not None and self._start["step"] == step - 1:
            output = self._finish(step, data, loss, losses)
        self._start = None
        if self.is_due(step):
            self._start = {
                "step": step,
                "params": data.params,
                "params_before": [p.detach().clone() for p in data.params],
                "f": loss,
                "var_f": _variance(losses),
                "dots": sum(data.per_sample(("Alpha", "start"))),
                "predicted": [self._pending.get(i) for i in range(len(data.params))],
            }
        return output

    def _finish(self, step, data, loss, losses):
        start = self._start
        update = torch.cat([u.reshape(-1) for u in start["update"]])
        t = float(update.norm())
        flags = []
        predicted = start["predicted"]
        if not math.isfinite(t):
            flags.append("Alpha: the update is not finite (the parameters diverged)")
        elif t == 0.0:
            flags.append("Alpha: the parameters did not change between the two steps")
        elif any(p is None for p in predicted) or not _parallel(torch.cat(predicted), update):
            flags.append(
                "Alpha: the update differs from the optimizer's predicted update "
                "(a scheduler or gradient clipping between backward and step?)"
            )
        if losses.numel() < 2 or not math.isfinite(start["var_f"]):
            flags.append("Alpha: a batch of one sample has no variance of the losses and slopes, which the fit needs")
        if flags:
            return Output(float("nan"), step=step - 1, flags=flags)
        predicted_norm = float(torch.cat(predicted).norm())
        slopes_start = start["dots"] / predicted_norm
        slopes_end = sum(data.per_sample(("Alpha", "end"))) / t
        mu = fit_quadratic(
            t,
            [start["f"], loss],
            [float(slopes_start.mean()), float(slopes_end.mean())],
            [start["var_f"], _variance(losses)],
            [_variance(slopes_start), _variance(slopes_end)],
        )
        return Output(alpha_from_fit(mu, t), step=step - 1)


def _parallel(predicted, real):
    """Whether ``real`` lies on the line of ``predicted`` (same direction) up to ``PREDICTION_RTOL``."""
    norm = predicted.norm()
    if float(norm) == 0.0:
        return False
    unit = predicted / norm
    along = torch.dot(real, unit)
    return float(along) > 0 and float((real - along * unit).norm()) <= PREDICTION_RTOL * float(real.norm())


def fit_quadratic(t, fs, dfs, var_fs, var_dfs):
    """Maximum-likelihood quadratic ``μ₀ + μ₁ x + μ₂ x²`` through noisy values and slopes at 0 and t.

    Observations ``y = (f(0), f(t), f'(0), f'(t))`` with independent Gaussian noise of
    variances ``Λ = diag(var_fs + var_dfs)``; rows of ``Φ`` map μ to them. Then
    ``μ = (Φ Λ⁻¹ Φᵀ)⁻¹ Φ Λ⁻¹ y``. Returns ``None`` if the system is singular.
    """
    eps = 1e-10
    variances = [v if v != 0 else eps for v in list(var_fs) + list(var_dfs)]
    phi = np.array([[1.0, 0.0, 0.0], [1.0, t, t**2], [0.0, 1.0, 0.0], [0.0, 1.0, 2 * t]]).T
    lam_inv = np.diag(1.0 / np.asarray(variances, dtype=float))
    y = np.asarray(list(fs) + list(dfs), dtype=float)
    try:
        return np.linalg.solve(phi @ lam_inv @ phi.T, phi @ lam_inv @ y)
    except np.linalg.LinAlgError:
        warnings.warn("Alpha: singular quadratic fit", stacklevel=2)
        return None


def alpha_from_fit(mu, t):
    """``α = 2t / (−μ₁/μ₂) − 1``; −1 for a concave fit; NaN without a fit."""
    if mu is None or not np.all(np.isfinite(mu)):
        return float("nan")
    if mu[2] < 0:
        return -1.0
    return float(2 * t / (-mu[1] / mu[2]) - 1)


def _variance(values):
    """The unbiased variance of the samples' values; NaN (no warning) for fewer than two."""
    return float(values.var()) if values.numel() > 1 else float("nan")
