"""Performance gauge: losses and accuracies.

Left axis: the mini-batch loss ``Loss`` at every tracked step (dots, with a bold
moving average) and the epoch-level ``train_loss`` / ``valid_loss`` / ``test_loss``
logged through ``Cockpit.log`` (lines with markers). Right axis: the logged
accuracies (dashed, 0–100 %). Steps flagged in the record (e.g. ``nonfinite_loss``)
get a red tick on the step axis and are counted in the title.

How to read it
- The mini-batch loss is noisy; read the moving average. A moving average that
  stalls while the gradient gauges look healthy often means the learning rate is
  too small (α near −1) or too large (α > 1).
- Train loss falling while valid loss rises: overfitting (compare the TIC gauge).
- Red ticks: the loss was NaN/Inf at those steps; what the other gauges show just
  before the first one (gradient norm spikes, α ≫ 1, λmax above 2/η) explains why.
The loss axis switches to a log scale when the values span more than a factor of 30.
"""

from .. import data, style
from ._common import finish_time_axes, label_points, marker_style, missing, not_tracked, raw_and_smooth

TITLE = "Performance"
LOSS_KEYS = ("Loss", "train_loss", "valid_loss", "test_loss")
ACC_KEYS = ("train_accuracy", "valid_accuracy", "test_accuracy")
KEYS = LOSS_KEYS + ACC_KEYS
MINIBATCH_COLOR = "#4d4d4d"  # neutral: the split colours belong to train/valid/test
SPLIT_COLORS = {"train": style.PRIMARY, "valid": style.SECONDARY, "test": style.TERTIARY}
FLAG_LABELS = {"nonfinite_loss": "non-finite loss"}
"""Short names of the reserved flags; any other flag is named by what precedes its first colon
(the quantity, e.g. ``TICTrace``), so that a sentence-long flag never becomes a legend entry."""
SHOWN_FLAGS = 3
"""Kinds of flags named in the title and legend (then "+n more")."""
FEW = 60
"""Up to this many losses are drawn as one raw line, unsmoothed."""


def gauge(record, ax, *, yscale="auto", accuracy=True, compact=False, smooth=True, color=None, outside_legend=True,
          **options):
    """Draw losses (left) and accuracies (right) over steps on ``ax``.

    Args:
        yscale: loss axis scale, ``"auto"``, ``"linear"`` or ``"log"``.
        accuracy: draw the accuracies on a right axis.
        compact: a shorter title (for narrow panels, e.g. the comparison view).
        smooth: overlay the smoothed mini-batch loss.
        color: colour of the mini-batch loss (default dark gray).
        outside_legend: put the legend right of the panel (it holds the last values).
    """
    absent = missing(record)(*KEYS)
    if len(absent) == len(KEYS):
        return not_tracked(ax, TITLE, ("Loss",) + LOSS_KEYS[1:2])
    parts, shown, last, lone = [], [], {}, []
    if "Loss" not in absent:
        xs, ys = data.finite(*data.series(record, "Loss"))
        if len(xs):
            if len(xs) <= FEW:  # a short run: every value on one line (smoothing would hide a spike)
                ax.plot(xs, ys, color=color or MINIBATCH_COLOR, linewidth=1.5, marker="o", label="mini-batch loss",
                        **marker_style(len(xs), 2.5))
                if len(xs) == 1:
                    lone.append((ax, xs[0], ys[0], style.fmt(ys[0]), color or MINIBATCH_COLOR))
            else:
                raw_and_smooth(ax, xs, ys, color or MINIBATCH_COLOR, label="mini-batch loss", smooth=smooth)
            shown.append(ys)
            parts.append(f"loss {style.fmt(data.recent(ys))} (recent median)")
    for split in ("train", "valid", "test"):
        key = f"{split}_loss"
        if key in absent:
            continue
        xs, ys = data.finite(*data.series(record, key))
        if len(xs):
            ax.plot(xs, ys, color=SPLIT_COLORS[split], linewidth=1.4, marker="s",
                    label=f"{split} loss {style.fmt(ys[-1])}", **marker_style(len(xs), 3))
            if len(xs) == 1:
                lone.append((ax, xs[0], ys[0], style.fmt(ys[0]), SPLIT_COLORS[split]))
            shown.append(ys)
            last[key] = ys[-1]
    if shown:
        style.auto_yscale(ax, *shown, scale=yscale)
    finish_time_axes(ax, options, ylabel="loss")
    if not shown:
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no finite loss", transform=ax.transAxes, ha="center", color=style.FLAG,
                fontsize=style.NOTE_SIZE)

    handles = ax.get_legend_handles_labels()[0]
    if accuracy and any(k not in absent for k in ACC_KEYS):
        ax2 = ax.twinx()
        for split in ("train", "valid", "test"):
            key = f"{split}_accuracy"
            if key in absent:
                continue
            xs, ys = data.finite(*data.series(record, key))
            if len(xs):
                ax2.plot(xs, 100 * ys, color=SPLIT_COLORS[split], linewidth=1.2, linestyle="--", marker="^",
                         label=f"{split} acc. {100 * ys[-1]:.1f}%", **marker_style(len(xs), 3))
                if len(xs) == 1:
                    lone.append((ax2, xs[0], 100 * ys[0], f"{100 * ys[0]:.1f}%", SPLIT_COLORS[split]))
                last[key] = ys[-1]
        ax2.set_ylim(0, 100)
        ax2.set_ylabel("accuracy [%]", fontsize=style.LABEL_SIZE, labelpad=1)
        ax2.tick_params(labelsize=style.TICK_SIZE, length=2.5, pad=1.5)
        ax2.spines["top"].set_visible(False)
        handles = handles + ax2.get_legend_handles_labels()[0]
    if lone:  # series of one point (one epoch so far): their values beside their markers
        label_points(ax, lone)
    # the title carries the held-out numbers: valid if logged, else test, else train
    for split in ("valid", "test", "train"):
        if f"{split}_loss" in last or f"{split}_accuracy" in last:
            numbers = []
            if f"{split}_loss" in last:
                numbers.append(style.fmt(last[f"{split}_loss"]))
            if f"{split}_accuracy" in last:
                numbers.append(f"{100 * last[f'{split}_accuracy']:.1f}%")
            if not compact:
                parts.append(f"{split} " + " / ".join(numbers))
            break

    flagged = data.flagged_steps(record)
    if flagged:
        kinds = sorted({FLAG_LABELS.get(f) or style.short_name(f.split(":")[0], 32) for fs in flagged.values() for f in fs})
        label = ", ".join(kinds[:SHOWN_FLAGS]) + (f" +{len(kinds) - SHOWN_FLAGS} more" if len(kinds) > SHOWN_FLAGS else "")
        handles = handles + [style.mark_steps(ax, flagged, label=label)]
        steps = sorted(flagged)
        where = ", ".join(str(s) for s in steps[:3]) + (" …" if len(steps) > 3 else "")
        parts.append(f"⚠ {label} @ {where}")
    if handles:
        if outside_legend:
            style.legend(ax, handles=handles, loc="upper left", bbox_to_anchor=(1.07, 1.0))
        else:
            style.legend(ax, handles=handles, loc="best", ncol=2 if len(handles) > 3 else 1)
    style.set_title(ax, " · ".join(parts) if parts else TITLE)
    if flagged:
        ax.title.set_color(style.FLAG)
