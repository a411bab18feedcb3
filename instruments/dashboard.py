"""The dashboard: the gauges of what a record holds, laid out in groups, saved as a PNG.

Only gauges with something to draw get a panel (``Gauge.has_data``); the groups that
remain share the figure. For a record with Cockpit's quantities (16 x 10 inches at
100 dpi by default, constrained layout)::

    +-------------+---------------+----------------+--------------+
    | STEP SIZE   | GRADIENTS     | GRADIENT NOISE | CURVATURE    |   one column per group
    | α           | tests         | mean GSNR      | λmax         |   with at least one
    | distance    | 1-d histogram | variance tr Σ  | Hessian trace|   tracked gauge
    | ‖g‖         | 2-d histogram | CABS           | TIC          |
    +-------------+---------------+----------------+--------------+
    | LAYER HEALTH: dead units | saturation | ‖g‖/‖θ‖ | ‖Δθ‖/‖θ‖     |   where the diagnosis
    +-------------+-------------------------------+----------------+   signals are recorded
    | HYPERPARAM. | PERFORMANCE: losses, early st. | DIAGNOSIS      |
    +-------------+-------------------------------+----------------+
    (optional LAYERWISE row: one histogram per parameter tensor)
    legend: the colour of each layer's thin line (shared by all panels)

A diagnosis-only record (``Cockpit(model)``: loss, gradient and parameter norms,
update sizes, activation statistics) has none of the upper groups: it gets the loss
and ‖g‖ with the findings marked next to the DIAGNOSIS panel on top, and the LAYER
HEALTH heat maps (layers × steps) below.

The DIAGNOSIS panel lists the record's findings, numbered; each finding's step is
marked (dashed line, same number) on the time axis of the gauges it concerns
(``gauges.findings.CONCERNS``).

Each group is a matplotlib ``SubFigure`` with a tinted background and a bold group
title; each gauge gets one Axes. Figures are ``matplotlib.figure.Figure`` objects
(never pyplot), so drawing and saving work headless and from any thread.
"""

import math
import os
import warnings

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from . import data, style
from .gauges import GAUGES, findings
from .gauges._common import draw_error

#: (group title, gauge names) of the upper block, one column per group.
LAYOUT = (
    ("STEP SIZE", ("alpha", "distance", "grad_norm")),
    ("GRADIENTS", ("gradient_tests", "histogram_1d", "histogram_2d")),
    ("GRADIENT NOISE", ("mean_gsnr", "grad_variance", "cabs")),
    ("CURVATURE", ("max_ev", "hess_trace", "tic")),
)
#: (group title, gauge names) of the row of per-layer heat maps (the diagnosis signals).
HEALTH = ("LAYER HEALTH", ("dead_units", "saturation", "grad_ratio", "update_ratio"))
#: (group title, [(gauge name, column span)], relative group width) of the bottom row.
BOTTOM = (
    ("HYPERPARAMETERS", (("hyperparameters", 1),), 1),
    ("PERFORMANCE", (("performance", 2), ("early_stopping", 1)), 3),
    ("DIAGNOSIS", (("findings", 1),), 2),
)
#: Gauges of the upper block that a diagnosis-only record has too (they then join PERFORMANCE).
BOOKKEEPING = ("grad_norm", "distance")


def plan(record):
    """Which gauges a ``Dashboard`` draws for ``record``, grouped as it lays them out.

    Returns ``{"upper": [(group, [gauge names])], "health": [gauge names],
    "bottom": [(group, [(gauge name, span)], width)], "diagnosis_only": bool}``.
    """
    has = {name: GAUGES[name].has_data(record) for name in GAUGES}
    upper = [(group, [n for n in names if has[n]]) for group, names in LAYOUT]
    upper = [(group, names) for group, names in upper if names]
    diagnosis_only = all(n in BOOKKEEPING for _, names in upper for n in names)
    moved = [n for _, names in upper for n in names] if diagnosis_only else []
    if diagnosis_only:
        upper = []
    health = [n for n in HEALTH[1] if has[n]]
    bottom = []
    for group, members, _ in BOTTOM:
        kept = [(n, span) for n, span in members if has[n]]
        if group == "PERFORMANCE":
            kept += [(n, 1) for n in moved]
        if kept:
            width = (sum(span for _, span in kept) if group == "PERFORMANCE" else
                     (2 if findings.findings_of(record) else 1) if group == "DIAGNOSIS" else 1)
            bottom.append((group, kept, width))
    return {"upper": upper, "health": health, "bottom": bottom, "diagnosis_only": diagnosis_only}


def _suptitle(run, title):
    record = run.record
    first, last = data.step_range(record)
    parts = [title or f"cockpit-lite · {run.name}", f"steps {first}–{last} ({len(record)} logged)"]
    seconds = data.wall_time(record)
    if math.isfinite(seconds) and seconds > 0:
        parts.append(f"{seconds:.1f} s wall, {(last - first) / seconds:.2f} steps/s")
    bought = data.budget_bought(record)
    if bought is not None:  # what the overhead budget bought: each tier's recorded steps
        parts.append(f"budget {bought['factor']:g}×: " + ", ".join(
            f"{tier} {entry['steps']} steps" for tier, entry in bought["tiers"].items()))
    return "   ·   ".join(parts)


class Dashboard:
    """Lay out all gauges for one run and render them to a figure or PNG.

    Args:
        figsize: figure size in inches (default 16 x 10; the layerwise row adds 3.2).
        dpi: resolution for ``save`` (default 100: the PNG is 1600 x 1000 pixels).
        layerwise: add a row with one histogram per parameter tensor.
        log_steps: symlog step axes (as Cockpit's ``show_log_iter``).
        title: figure title (default: "cockpit-lite · <run name>").
        options: ``{gauge name: {option: value}}`` passed to single gauges, e.g.
            ``{"histogram_1d": {"layers": True}}``.
        strict: re-raise a gauge's exception instead of drawing "could not draw".
        extra: record keys of further (custom) quantities, drawn in a row of their
            own, one panel each (``gauges.any_quantity``).

    After ``draw``, ``self.axes`` maps each gauge name to its Axes and
    ``self.figure`` is the figure.
    """

    def __init__(self, figsize=(16, 10), dpi=100, layerwise=False, log_steps=False, title=None, options=None,
                 strict=False, extra=()):
        self.figsize = tuple(figsize)
        self.dpi = dpi
        self.layerwise = layerwise
        self.log_steps = log_steps
        self.title = title
        self.options = dict(options or {})
        self.strict = strict
        self.extra = tuple(extra)
        self.axes = {}
        self.figure = None

    # ------------------------------------------------------------------ drawing

    def _draw_gauge(self, name, record, ax, common):
        options = {**common, **self.options.get(name, {})}
        try:
            GAUGES[name].draw(record, ax, **options)
        except Exception as error:  # a broken panel must not take the dashboard down
            if self.strict:
                raise
            warnings.warn(f"instruments: gauge {name!r} failed: {error!r}", RuntimeWarning, stacklevel=3)
            draw_error(ax, GAUGES[name].title, error)
        self.axes[name] = ax

    def draw(self, source, fig=None):
        """Draw the dashboard for ``source`` (record, log path, live cockpit or ``Run``).

        Args:
            source: anything ``instruments.data.load`` accepts.
            fig: draw into this (empty) Figure instead of a new one (it is switched
                to constrained layout).

        Returns:
            The matplotlib ``Figure``.
        """
        run = data.load(source)
        record = run.record
        n_layers = data.n_layers(record)
        names = run.layer_names(n_layers)
        common = {"params": names, "log_steps": self.log_steps, "step_range": data.step_range(record)}

        layout = plan(record)
        width, height = self.figsize
        if layout["upper"] and layout["health"]:
            height += 2.6
        if self.layerwise:
            height += 3.2
        if self.extra:
            height += 2.6
        if fig is None:
            fig = Figure(figsize=(width, height), dpi=self.dpi, layout="constrained")
        if fig.get_layout_engine() is None or not hasattr(fig.get_layout_engine(), "set"):
            fig.set_layout_engine("constrained")
        fig.get_layout_engine().set(w_pad=0.04, h_pad=0.04, wspace=0.02, hspace=0.02)
        self.axes = {}
        self.figure = fig
        self.layout = layout

        blocks = []  # (kind, height ratio)
        if layout["upper"]:
            tallest = max(len(names) for _, names in layout["upper"])
            blocks.append(("upper", 1.0 * tallest))
        if layout["diagnosis_only"] and layout["bottom"]:
            blocks.append(("bottom", 1.5))
        if layout["health"]:
            blocks.append(("health", 1.35))
        if layout["bottom"] and not layout["diagnosis_only"]:
            blocks.append(("bottom", 1.15))
        if not blocks:  # nothing any gauge can draw: say so in one panel
            blocks.append(("empty", 1.0))
        blocks += ([("layerwise", 1.3)] if self.layerwise else []) + ([("extra", 1.0)] if self.extra else [])
        outer = fig.subfigures(len(blocks), 1, height_ratios=[h for _, h in blocks], hspace=0.01, squeeze=False)
        rows = dict(zip([kind for kind, _ in blocks], outer[:, 0]))

        if "upper" in rows:
            groups = layout["upper"]
            upper = rows["upper"].subfigures(1, len(groups), wspace=0.008, squeeze=False)[0]
            for sub, (group, names_in_group) in zip(upper, groups):
                self._group(sub, group)
                axes = sub.subplots(len(names_in_group), 1, squeeze=False)[:, 0]
                for name, ax in zip(names_in_group, axes):
                    self._draw_gauge(name, record, ax, common)
        if "health" in rows:
            sub = rows["health"]
            self._group(sub, HEALTH[0])
            for name, ax in zip(layout["health"], sub.subplots(1, len(layout["health"]), squeeze=False)[0]):
                self._draw_gauge(name, record, ax, common)
        if "bottom" in rows:
            groups = layout["bottom"]
            lower = rows["bottom"].subfigures(1, len(groups), width_ratios=[w for *_, w in groups], wspace=0.008,
                                              squeeze=False)[0]
            for sub, (group, members, _) in zip(lower, groups):
                self._group(sub, group)
                grid = sub.add_gridspec(1, sum(span for _, span in members))
                column = 0
                for name, span in members:
                    ax = sub.add_subplot(grid[0, column:column + span])
                    column += span
                    self._draw_gauge(name, record, ax, common)
        if "empty" in rows:
            ax = rows["empty"].subplots()
            style.note(ax, "nothing to draw: the record holds no quantity a gauge reads")
            self.axes["empty"] = ax
        findings.mark(record, self.axes)

        if self.layerwise:
            from .gauges.histogram_2d import layerwise_grid

            sub = rows["layerwise"]
            sub.set_facecolor(style.GROUP_COLORS["LAYERWISE"])
            sub.suptitle("LAYERWISE", fontsize=10, fontweight="bold")  # layerwise_grid names the step
            self.axes["layerwise"] = layerwise_grid(record, sub, params=names, log_steps=self.log_steps,
                                                    marginals=False)

        if self.extra:
            from .gauges import any_quantity

            sub = rows["extra"]
            sub.set_facecolor(style.GROUP_COLORS.get("MORE QUANTITIES", "white"))
            sub.suptitle("MORE QUANTITIES", fontsize=10, fontweight="bold")
            for key, ax in zip(self.extra, sub.subplots(1, len(self.extra), squeeze=False)[0]):
                try:
                    any_quantity.gauge(record, ax, key, **common)
                except Exception as error:
                    if self.strict:
                        raise
                    warnings.warn(f"instruments: panel {key!r} failed: {error!r}", RuntimeWarning, stacklevel=2)
                    draw_error(ax, key, error)
                self.axes[key] = ax

        if n_layers > 1:
            self._layer_legend(fig, names)
        fig.suptitle(_suptitle(run, self.title), fontsize=12, fontweight="bold")
        return fig

    @staticmethod
    def _group(sub, title):
        sub.set_facecolor(style.GROUP_COLORS.get(title, "white"))
        sub.suptitle(title, fontsize=10, fontweight="bold")

    @staticmethod
    def _layer_legend(fig, names):
        colors = style.layer_colors(len(names))
        handles = [Line2D([], [], color=style.TOTAL, linewidth=2.0, label="total")]
        if len(names) <= 16:
            handles += [Line2D([], [], color=c, linewidth=1.2, label=style.short_name(n, 22))
                        for c, n in zip(colors, names)]
        else:
            shown = [0, len(names) // 2, len(names) - 1]
            handles += [Line2D([], [], color=colors[i], linewidth=1.2,
                               label=f"{i}: {style.short_name(names[i], 22)}") for i in shown]
            handles.append(Line2D([], [], color="none", label=f"(viridis over all {len(names)} tensors)"))
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 9),
                   fontsize=style.LEGEND_SIZE + 0.5, frameon=False, title="thin lines = layers (parameter tensors)",
                   title_fontsize=style.LEGEND_SIZE + 0.5, handlelength=1.8, columnspacing=1.2)

    # ------------------------------------------------------------------ saving

    def save(self, source, path, **savefig_kwargs):
        """Draw ``source`` and save it to ``path`` (format from the extension, PNG by default).

        Text from the record is drawn literally (``data.literal_text``: a ``$`` in a finding
        is a dollar sign), and the file is written atomically (``data.atomic_save``: a
        process killed while saving never leaves a truncated picture). Returns the path.
        """
        with data.literal_text():
            fig = self.draw(source)
        path = os.fspath(path)
        savefig_kwargs.setdefault("dpi", self.dpi)
        data.atomic_save(lambda temporary: fig.savefig(temporary, **savefig_kwargs), path)
        return path


def render(source, path, **dashboard_options):
    """Render ``source`` to ``path`` with a default ``Dashboard``; returns the path."""
    return Dashboard(**dashboard_options).save(source, path)
