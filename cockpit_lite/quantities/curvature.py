"""Base class of the quantities that use the diagonal of the loss curvature.

Where the curvature comes from (``curvature=``, recorded at every step under
``record[step]["meta"][name]["curvature"]``):

- ``"diag_h"``: the exact Hessian diagonal, BackPACK ``DiagHessian`` (models BackPACK serves);
- ``"diag_ggn_exact"``: the exact generalised Gauss-Newton diagonal: BackPACK
  ``DiagGGNExact`` where BackPACK serves the model and the loss (also for residual networks
  converted with ``cockpit_lite.extend(model, use_converter=True)``), else the per-sample
  engine's (``cockpit_lite.curvature.ggn``: one backward pass per output row position and
  class, on any model the engine serves; the record's ``meta`` also holds ``"passes"``);
- ``"diag_ggn_mc"``: its Monte-Carlo estimate, BackPACK ``DiagGGNMC`` where BackPACK serves the
  model (one sample), else the engine's from ``probes`` sampled labels, with jackknife standard
  errors (``"se"``, ``"layers_se"``, ``"df"``);
- ``"hutchinson"``: Hutchinson's estimate of the Hessian diagonal from ``probes``
  Hessian-vector products (``cockpit_lite.curvature.hutchinson``), on any
  twice-differentiable model, computed before the user's backward pass (which stays
  plain; ``info["loss"]`` is read); the record also gets ``"probes"``, the standard
  errors ``"se"`` (total) and ``"layers_se"``, and their degrees of freedom ``"df"``;
- ``"auto"`` (default): for a quantity of the Hessian (``HessTrace``), ``"diag_h"`` where
  BackPACK supports the step's model and loss (``cockpit_lite.backend.curvature_support``,
  decided before the backward pass), else ``"hutchinson"``: "auto" never switches it to the
  GGN, a different matrix. For an ``EXACT_ONLY`` quantity (the TICs): BackPACK's ``"diag_h"``
  where BackPACK supports the model, else the engine's exact GGN diagonal where it takes at
  most ``max_passes`` backward passes, else nothing (below). Given parameters only
  (``Cockpit(model.parameters())``, Cockpit's recipe), the model is the module the engine
  found owning them in the forward pass, so an extended model and loss get BackPACK's exact
  diagonal as with ``Cockpit(model)``. Where "auto" estimates although the model or the loss
  is BackPACK-extended (the user meant the exact diagonal), or no owning module was found, it
  warns once before the backward pass, naming the layer BackPACK cannot serve.

An explicitly chosen curvature that cannot run on the step (``"diag_h"`` beyond BackPACK's
layers, a GGN the engine has no factor of the loss for) raises a ``ValueError`` naming the
reason and the fix before the backward pass runs.

A quantity with ``EXACT_ONLY`` (the TICs, ratios with the curvature in the denominator)
takes only an exact diagonal, ``"diag_h"`` or ``"diag_ggn_exact"``: the ratio of an
estimate is not an estimate of the ratio (a noisy ``C_dd`` near zero dominates it, and
no standard error of the denominator's noise describes that). Where only an estimate
would run (``"hutchinson"``, ``"diag_ggn_mc"``, or ``"auto"`` with neither exact diagonal) it
records NaN with a flag naming why and the fix and computes nothing
(``record[step]["meta"][name] == {"curvature": None}``).
"""

import warnings

import torch

from cockpit_lite.curvature import derivatives, ggn, hutchinson
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
    "Fix: pass curvature='diag_ggn_exact' (the exact GGN diagonal, from the engine on any model it "
    "serves, at the cost of the passes), or raise max_passes; for the Hessian's diagonal, wrap the "
    "model and the loss module in cockpit_lite.extend(...) and use only layers BackPACK supports"
)
MAX_PASSES = 32
"""The most backward passes per step ``curvature="auto"`` spends on the engine's exact GGN diagonal."""


class CurvatureQuantity(SingleStepQuantity):
    """A quantity computed from a diagonal curvature ``C`` (see the module docstring).

    Subclasses implement ``parts(data, diagonal) -> (total, per-layer list)`` (tensors,
    linear or not in the diagonal) and may override ``package``.
    """

    EXACT_ONLY = False
    """Whether only an exact diagonal (``EXACT``) may enter (see the module docstring)."""

    def __init__(self, track_schedule=None, verbose=False, curvature=AUTO, probes=16, seed=0, max_passes=MAX_PASSES):
        """
        Args:
            curvature: one of ``CHOICES``.
            probes: random vectors per step of an estimate: Rademacher probes of Hutchinson's
                estimator (``K`` products), sampled labels of the engine's Monte-Carlo GGN
                (``K`` backward passes).
            seed: seed of the random vectors (combined with the step; the user's RNG is untouched).
            max_passes: the most backward passes of the engine's exact GGN diagonal that
                ``curvature="auto"`` takes per step (``EXACT_ONLY`` quantities).
        """
        super().__init__(track_schedule, verbose)
        if curvature not in CHOICES:
            raise ValueError(f"{self.name}: unknown curvature {curvature!r}; choose one of {list(CHOICES)}")
        if int(probes) != probes or probes < 1:
            raise ValueError(f"{self.name}: probes must be a positive integer, got {probes!r}")
        if int(max_passes) != max_passes or max_passes < 0:
            raise ValueError(f"{self.name}: max_passes must be a non-negative integer, got {max_passes!r}")
        self.curvature, self.probes, self.seed, self.max_passes = curvature, int(probes), seed, int(max_passes)
        self._method = None  # the method decided before the step's backward pass
        self._unavailable = None  # why no exact diagonal runs at the chosen step (EXACT_ONLY)
        self._estimate = None  # Hutchinson's estimate of the step, from before_backward to compute
        self._warned = False

    def method(self, info):
        """The curvature that will run at this step (``info``: the step's ``StepInfo``): a BackPACK
        curvature's name, ``HUTCHINSON``, or the engine's ``ggn.Request``.

        ``None`` for an ``EXACT_ONLY`` quantity that would get an estimate; the reason is
        then in ``self._unavailable``.
        """
        if self.EXACT_ONLY:
            return self._exact_method(info)
        if self.curvature == HUTCHINSON:
            return HUTCHINSON
        if self.curvature != AUTO:
            return self._chosen_method(info, self.curvature)
        reason = curvature_support(info.model, info.get("loss"), "diag_h")
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

    def _chosen_method(self, info, name):
        """An explicitly chosen curvature ``name``: BackPACK's where it serves the step, else the
        engine's GGN diagonal; a ``ValueError`` naming both reasons where neither runs."""
        reason = curvature_support(info.model, info.get("loss"), name)
        if reason is None:
            return name
        problem = "the engine computes only GGN diagonals" if name == "diag_h" else ggn.support(info)
        if problem is not None:
            raise ValueError(unsupported_message(self.name, name, f"{reason}; and {problem}"))
        return ggn.Request(name, self.probes, self.seed) if name == ggn.MONTE_CARLO else ggn.Request(name)

    def _exact_method(self, info):
        self._unavailable = None
        if self.curvature not in (AUTO, *EXACT):
            self._unavailable = (
                f"curvature={self.curvature!r} is an estimate of the diagonal, and {self.name} "
                "divides by it: the ratio of an estimate is not an estimate of the ratio "
                "(a noisy C_dd near zero dominates it)"
            )
            return None
        if self.curvature != AUTO:
            return self._chosen_method(info, self.curvature)
        reason = curvature_support(info.model, info.get("loss"), "diag_h")
        if reason is None:
            return "diag_h"
        problem = ggn.support(info, self.max_passes)
        if problem is None:
            return ggn.Request(ggn.EXACT)
        self._unavailable = (
            f"{reason} (no exact Hessian diagonal from BackPACK), and {problem}, so curvature='auto' has "
            f"no exact diagonal, and {self.name} from an estimated one would not be an estimate of the ratio"
        )
        return None

    def _needs(self, step, info):
        base = super()._needs(step, info)
        method = self.method(info)
        self._method = method
        if method is None:
            return Needs()
        if method == HUTCHINSON:
            info.require("loss", self.name)
            derivatives.enable()
            return Needs(transforms=base.transforms, hvp=True)
        if isinstance(method, ggn.Request):
            return Needs(transforms=base.transforms, diagonals=(method,))
        return Needs(transforms=base.transforms, extensions=(curvature_extension(method, self.name),))

    def before_backward(self, step, products):
        """Hutchinson's estimate from the step's Hessian-vector products (shared by quantities with the
        same probes and seed)."""
        self._estimate = hutchinson.estimate(products, self.probes, self.seed)

    def observes(self, step):
        """As the base class, except never for an ``EXACT_ONLY`` quantity given an estimate, and
        always when due with a GGN curvature (the engine's passes read the forward pass)."""
        if self.EXACT_ONLY and self.curvature not in (AUTO, *EXACT):
            return False
        if self.curvature in (ggn.EXACT, ggn.MONTE_CARLO):
            return self.is_due(step)
        return super().observes(step)

    def compute(self, step, data):
        method = self._method
        if method is None:
            nan = float("nan")
            flag = f"{self.name}: not computed: {self._unavailable}. {EXACT_FIX}"
            return Output(nan, [nan] * len(data.params), flags=[flag], meta={"curvature": None})
        flags = []
        if method == HUTCHINSON:
            estimate, self._estimate = self._estimate, None
            meta = {"curvature": method}
        elif isinstance(method, ggn.Request):
            found = data.diagonal(method)
            estimate, flags = found.estimate, found.flags
            meta = {"curvature": method.method, "passes": found.passes}
        else:
            estimate, meta = None, {"curvature": method}
        diagonal = data.curvature(method) if estimate is None else estimate.diagonal
        if estimate is not None:

            def stacked(candidate):
                total, layers = self.parts(data, candidate)
                return torch.stack([total, *layers])

            se = estimate.standard_error(stacked)
            meta.update(probes=estimate.probes, se=se[0], layers_se=list(se[1:]), df=estimate.degrees_of_freedom)
        total, layers = self.parts(data, diagonal)
        out = self.package(total, layers, meta)
        out.flags.extend(flags)
        return out

    def parts(self, data, diagonal):
        """``(total, [per layer])`` of the statistic for the per-parameter ``diagonal``."""
        raise NotImplementedError

    def package(self, total, layers, meta):
        """The ``Output`` to record (default: the total, with the per-layer values)."""
        return Output(total, layers, meta=meta)
