"""Base class of the quantities that use the diagonal of the loss curvature.

Where the curvature comes from (``curvature=``, recorded at every step under
``record[step]["meta"][name]["curvature"]``):

- ``"diag_h"``: the exact Hessian diagonal, BackPACK ``DiagHessian``;
- ``"diag_ggn_exact"``: the exact generalised Gauss-Newton diagonal, BackPACK
  ``DiagGGNExact`` (also for residual networks converted with
  ``cockpit_lite.extend(model, use_converter=True)``);
- ``"diag_ggn_mc"``: its Monte-Carlo estimate, BackPACK ``DiagGGNMC``;
- ``"hutchinson"``: Hutchinson's estimate of the Hessian diagonal from ``probes``
  Hessian-vector products (``cockpit_lite.curvature.hutchinson``), on any
  twice-differentiable model, computed before the user's backward pass (which stays
  plain; ``info["loss"]`` is read); the record also gets ``"probes"`` and the standard
  errors ``"se"`` (total) and ``"layers_se"``;
- ``"auto"`` (default): ``"diag_h"`` where BackPACK supports the step's model and loss
  (``cockpit_lite.backend.curvature_support``, decided before the backward pass), else
  ``"hutchinson"``. Both are the Hessian: "auto" never switches to the GGN, a different
  matrix. Given parameters only (``Cockpit(model.parameters())``, Cockpit's recipe), the
  model is the module the engine found owning them in the forward pass, so an extended
  model and loss get BackPACK's exact diagonal as with ``Cockpit(model)``. Where "auto"
  estimates although the model or the loss is BackPACK-extended (the user meant the exact
  diagonal), or no owning module was found, it warns once before the backward pass,
  naming the layer BackPACK cannot serve.

An explicitly chosen BackPACK curvature that the model does not support raises a
``ValueError`` naming the layer and the fix before the backward pass runs.

A quantity with ``EXACT_ONLY`` (the TICs, ratios with the curvature in the denominator)
takes only an exact diagonal, ``"diag_h"`` or ``"diag_ggn_exact"``: the ratio of an
estimate is not an estimate of the ratio (a noisy ``C_dd`` near zero dominates it, and
no standard error of the denominator's noise describes that). Where only an estimate
would run (``"hutchinson"``, ``"diag_ggn_mc"``, or ``"auto"`` on a model BackPACK cannot
serve) it records NaN with a flag naming why and the fix and computes nothing
(``record[step]["meta"][name] == {"curvature": None}``).
"""

import warnings

import torch

from cockpit_lite.curvature import hutchinson, sdpa
from cockpit_lite.backend import (
    CURVATURES, backpack_extended, curvature_extension, curvature_support, unsupported_message,
)
from cockpit_lite.quantities.base import Needs, Output, SingleStepQuantity

HUTCHINSON = "hutchinson"
AUTO = "auto"
CHOICES = (AUTO, *CURVATURES, HUTCHINSON)
EXACT = ("diag_h", "diag_ggn_exact")
"""The curvatures that are exact diagonals (of the Hessian, of the GGN)."""
EXACT_FIX = (
    "Fix: wrap the model and the loss module in cockpit_lite.extend(...) and use only layers "
    "BackPACK supports (curvature='auto' or 'diag_h', the Hessian), or pass "
    "curvature='diag_ggn_exact' (the GGN; residual networks: cockpit_lite.extend(model, "
    "use_converter=True))"
)


class CurvatureQuantity(SingleStepQuantity):
    """A quantity computed from a diagonal curvature ``C`` (see the module docstring).

    Subclasses implement ``parts(data, diagonal) -> (total, per-layer list)`` (tensors,
    linear or not in the diagonal) and may override ``package``.
    """

    CURVATURE = True
    EXACT_ONLY = False
    """Whether only an exact diagonal (``EXACT``) may enter (see the module docstring)."""

    def __init__(self, track_schedule=None, verbose=False, curvature=AUTO, probes=16, seed=0):
        """
        Args:
            curvature: one of ``CHOICES``.
            probes: Rademacher probes of Hutchinson's estimator (``K`` products per step).
            seed: seed of the probes (combined with the step; the user's RNG is untouched).
        """
        super().__init__(track_schedule, verbose)
        if curvature not in CHOICES:
            raise ValueError(f"{self.name}: unknown curvature {curvature!r}; choose one of {list(CHOICES)}")
        if int(probes) != probes or probes < 1:
            raise ValueError(f"{self.name}: probes must be a positive integer, got {probes!r}")
        self.curvature, self.probes, self.seed = curvature, int(probes), seed
        self._chosen = None  # (step, method) decided before the step's backward pass
        self._unavailable = None  # why no exact diagonal runs at the chosen step (EXACT_ONLY)
        self._estimate = None  # Hutchinson's estimate of the step, from before_backward to compute
        self._warned = False

    def method(self, info):
        """The curvature that will run at this step (``info``: the step's ``StepInfo``).

        ``None`` for an ``EXACT_ONLY`` quantity that would get an estimate; the reason is
        then in ``self._unavailable``.
        """
        if self.EXACT_ONLY:
            return self._exact_method(info)
        if self.curvature == HUTCHINSON:
            return HUTCHINSON
        reason = curvature_support(info.model, info.get("loss"), "diag_h" if self.curvature == AUTO else self.curvature)
        if self.curvature != AUTO:
            if reason is not None:
                raise ValueError(unsupported_message(self.name, self.curvature, reason))
            return self.curvature
        if reason is None:
            return "diag_h"
        if not self._warned and (info.model is None or backpack_extended(info.model, info.get("loss"))):
            self._warned = True
            warnings.warn(
                f"{self.name}: {reason}; curvature='auto' uses Hutchinson's estimator "
                "(Hessian-vector products) instead of BackPACK's exact Hessian diagonal. "
                "For the exact diagonal, extend every layer and the loss module with "
                "cockpit_lite.extend(...) and use only layers BackPACK supports.",
                stacklevel=5,
            )
        return HUTCHINSON

    def _exact_method(self, info):
        self._unavailable = None
        if self.curvature not in (AUTO, *EXACT):
            self._unavailable = (
                f"curvature={self.curvature!r} is an estimate of the diagonal, and {self.name} "
                "divides by it: the ratio of an estimate is not an estimate of the ratio "
                "(a noisy C_dd near zero dominates it)"
            )
            return None
        name = "diag_h" if self.curvature == AUTO else self.curvature
        reason = curvature_support(info.model, info.get("loss"), name)
        if reason is None:
            return name
        if self.curvature != AUTO:
            raise ValueError(unsupported_message(self.name, self.curvature, reason))
        self._unavailable = (
            f"{reason}, so curvature='auto' has no exact Hessian diagonal, and {self.name} "
            "from an estimated one (Hutchinson's) would not be an estimate of the ratio"
        )
        return None

    def _needs(self, step, info):
        base = super()._needs(step, info)
        method = self.method(info)
        self._chosen = (step, method)
        if method is None:
            return Needs()
        if method == HUTCHINSON:
            info.require("loss", self.name)
            sdpa.enable_double_backward()
            return Needs(transforms=base.transforms, hvp=True)
        return Needs(transforms=base.transforms, extensions=(curvature_extension(method, self.name),))

    def before_backward(self, step, products):
        """Hutchinson's estimate from the step's Hessian-vector products (shared by quantities with the
        same probes and seed)."""
        self._estimate = hutchinson.estimate(products, self.probes, self.seed)

    def observes(self, step):
        """As the base class, except never for an ``EXACT_ONLY`` quantity given an estimate."""
        if self.EXACT_ONLY and self.curvature not in (AUTO, *EXACT):
            return False
        return super().observes(step)

    def compute(self, step, data):
        method = self._chosen[1]
        if method is None:
            nan = float("nan")
            flag = f"{self.name}: not computed: {self._unavailable}. {EXACT_FIX}"
            return Output(nan, [nan] * len(data.params), flags=[flag], meta={"curvature": None})
        if method == HUTCHINSON:
            estimate, self._estimate = self._estimate, None
            diagonal = estimate.diagonal

            def stacked(candidate):
                total, layers = self.parts(data, candidate)
                return torch.stack([total, *layers])

            se = estimate.standard_error(stacked)
            meta = {"curvature": method, "probes": self.probes, "se": se[0], "layers_se": list(se[1:])}
        else:
            diagonal = data.curvature(method)
            meta = {"curvature": method}
        total, layers = self.parts(data, diagonal)
        return self.package(total, layers, meta)

    def parts(self, data, diagonal):
        """``(total, [per layer])`` of the statistic for the per-parameter ``diagonal``."""
        raise NotImplementedError

    def package(self, total, layers, meta):
        """The ``Output`` to record (default: the total, with the per-layer values)."""
        return Output(total, layers, meta=meta)
