"""Early-stopping gauge: the evidence-based (EB) stopping criterion.

``EarlyStopping``: the criterion of Mahsereci et al. (2017), computed from the
mini-batch gradient and its per-sample variance alone, without a validation set.
Raw values as dots, moving average bold; the region above 0 is shaded.

How to read it
- Negative: the gradient is still larger than its noise would explain; keep
  training.
- Positive (shaded): the gradient is statistically indistinguishable from zero
  given the noise; further training mostly fits noise, so stopping is suggested.
  Read the smoothed line: single steps cross 0 by chance. The title gives the
  median of the recent values and the verdict it implies.
"""

from .. import data, style
from ._common import finish_time_axes, missing, no_finite, not_tracked, raw_and_smooth

TITLE = "Early stopping (EB criterion)"
KEYS = ("EarlyStopping",)


def gauge(record, ax, *, yscale="linear", **options):
    """Draw the EB criterion over steps on ``ax``; > 0 suggests stopping."""
    if missing(record)(*KEYS):
        return not_tracked(ax, TITLE, KEYS)
    xs, ys = data.finite(*data.series(record, "EarlyStopping"))
    if len(xs) == 0:
        return no_finite(ax, TITLE, KEYS, record)
    raw_and_smooth(ax, xs, ys, style.QUATERNARY, label="EB criterion")
    style.auto_yscale(ax, ys, scale=yscale)
    lo, hi = ax.get_ylim()
    hi = max(hi, abs(lo) * 0.1)
    ax.axhline(0.0, color=style.REFERENCE, linewidth=0.9)
    ax.axhspan(0.0, hi, color=style.FLAG, alpha=0.06, zorder=0)
    ax.set_ylim(lo, hi)
    finish_time_axes(ax, options, ylabel="criterion")
    current = data.recent(ys)
    verdict = "stop" if current > 0 else "continue"
    style.set_title(ax, f"EB criterion {style.fmt(current)} → {verdict}")
