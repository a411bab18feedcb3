"""Tracking levels: ``economy`` ⊂ ``business`` ⊂ ``full``, exactly Cockpit's, plus opt-in extras."""

from cockpit_lite import quantities as q
from cockpit_lite.quantities.curvature import CHOICES, CurvatureQuantity

LEVELS = {
    "economy": (
        q.Alpha, q.Distance, q.GradHist1d, q.GradNorm, q.InnerTest, q.Loss, q.NormTest,
        q.OrthoTest, q.UpdateSize,
    ),
}
LEVELS["business"] = LEVELS["economy"] + (q.TICDiag, q.HessTrace)
LEVELS["full"] = LEVELS["business"] + (q.HessMaxEV, q.GradHist2d)
"""Cockpit's levels, class for class (a ported script records what Cockpit would)."""

EXTRAS = {"economy": (q.MeanGSNR, q.GradVariance)}
EXTRAS["business"] = EXTRAS["economy"] + (q.TICTrace,)
EXTRAS["full"] = EXTRAS["business"]
"""What cockpit-lite adds to each level with ``extras=True`` (quantities Cockpit tracked at
no level, at the cost of the level they are listed in: ``MeanGSNR`` and ``GradVariance``
reuse economy's per-sample work, ``TICTrace`` business's curvature)."""


def quantities_cls_for_configuration(label, extras=False):
    """The quantity classes of a level: Cockpit's (``extras=True``: and ``EXTRAS[label]``).

    Raises:
        ValueError: for an unknown level.
    """
    if label not in LEVELS:
        raise ValueError(f"unknown level {label!r}; choose one of {sorted(LEVELS)}")
    return LEVELS[label] + (EXTRAS[label] if extras else ())


def configuration(label, track_schedule=None, verbose=False, curvature="auto", extras=False):
    """Return new instances of the quantities of level ``label``, all on ``track_schedule``.

    The levels are Cockpit's, class for class (``LEVELS``), so a ported script records
    what Cockpit recorded and Cockpit's own plotter can draw it.

    Args:
        label: ``"economy"``, ``"business"`` or ``"full"``.
        track_schedule: callable ``step -> bool``; default: every step. For an overhead
            budget that spaces out the expensive quantities, pass
            ``Cockpit(..., budget=1.25)`` instead (see ``cockpit_lite.budget``).
        verbose: passed to each quantity.
        curvature: where ``HessTrace``, ``TICDiag`` (and ``TICTrace``) take the curvature
            diagonal from: ``"auto"`` (exact BackPACK Hessian diagonal where BackPACK
            supports the model, else Hutchinson's estimate), ``"diag_h"``,
            ``"diag_ggn_exact"``, ``"diag_ggn_mc"`` or ``"hutchinson"`` (see
            ``cockpit_lite.quantities.curvature``; the record's ``meta`` says which ran).
        extras: also the quantities cockpit-lite adds at this level (``EXTRAS``:
            ``MeanGSNR`` and ``GradVariance`` from economy on, ``TICTrace`` from business on).

    Raises:
        ValueError: for an unknown level or curvature.
    """
    if curvature not in CHOICES:
        raise ValueError(f"unknown curvature {curvature!r}; choose one of {list(CHOICES)}")
    built = []
    for cls in quantities_cls_for_configuration(label, extras):
        options = {"curvature": curvature} if issubclass(cls, CurvatureQuantity) else {}
        built.append(cls(track_schedule=track_schedule, verbose=verbose, **options))
    return built
