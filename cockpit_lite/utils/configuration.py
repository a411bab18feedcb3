"""Tracking levels: ``economy`` ⊂ ``business`` ⊂ ``full``."""

from cockpit_lite import quantities as q

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


def configuration(label, track_schedule=None, verbose=False):
    """Return new instances of the quantities of level ``label``, all on ``track_schedule``.

    Args:
        label: ``"economy"``, ``"business"`` or ``"full"``.
        track_schedule: callable ``step -> bool``; default: every step.
        verbose: passed to each quantity.
    """
    return [cls(track_schedule=track_schedule, verbose=verbose) for cls in quantities_cls_for_configuration(label)]
