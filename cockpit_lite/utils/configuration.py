"""Tracking levels: ``economy`` ⊂ ``business`` ⊂ ``full``."""

from cockpit_lite import quantities as q
from cockpit_lite.quantities.curvature import CHOICES, CurvatureQuantity

LEVELS = {
    "economy": (
        q.Alpha, q.Distance, q.GradHist1d, q.GradNorm, q.InnerTest, q.Loss, q.NormTest,
        q.OrthoTest, q.UpdateSize, q.MeanGSNR, q.GradVariance,
    ),
}
LEVELS["business"] = LEVELS["economy"] + (q.TICDiag, q.TICTrace, q.HessTrace)
LEVELS["full"] = LEVELS["business"] + (q.HessMaxEV, q.GradHist2d)


def quantities_cls_for_configuration(label):
    """The quantity classes of a level (Cockpit's economy/business/full plus MeanGSNR,
    GradVariance and TICTrace, which Cockpit tracked at no level)."""
    if label not in LEVELS:
        raise ValueError(f"unknown level {label!r}; choose one of {sorted(LEVELS)}")
    return LEVELS[label]


def configuration(label, track_schedule=None, verbose=False, curvature="auto"):
    """Return new instances of the quantities of level ``label``, all on ``track_schedule``.

    Args:
        label: ``"economy"``, ``"business"`` or ``"full"``.
        track_schedule: callable ``step -> bool``; default: every step. For an overhead
            budget that spaces out the expensive quantities, pass
            ``Cockpit(..., budget=1.25)`` instead (see ``cockpit_lite.budget``).
        verbose: passed to each quantity.
        curvature: where ``HessTrace``, ``TICDiag`` and ``TICTrace`` take the curvature
            diagonal from: ``"auto"`` (exact BackPACK Hessian diagonal where BackPACK
            supports the model, else Hutchinson's estimate), ``"diag_h"``,
            ``"diag_ggn_exact"``, ``"diag_ggn_mc"`` or ``"hutchinson"`` (see
            ``cockpit_lite.quantities.curvature``; the record's ``meta`` says which ran).

    Raises:
        ValueError: for an unknown level or curvature.
    """
    if curvature not in CHOICES:
        raise ValueError(f"unknown curvature {curvature!r}; choose one of {list(CHOICES)}")
    built = []
    for cls in quantities_cls_for_configuration(label):
        options = {"curvature": curvature} if issubclass(cls, CurvatureQuantity) else {}
        built.append(cls(track_schedule=track_schedule, verbose=verbose, **options))
    return built
