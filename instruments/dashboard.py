"""The dashboard: all gauges on one figure, laid out in groups, saved as a PNG.

Layout (16 x 10 inches at 100 dpi by default, constrained layout)::

    +-------------+---------------+----------------+--------------+
    | STEP SIZE   | GRADIENTS     | GRADIENT NOISE | CURVATURE    |
    | α           | tests         | mean GSNR      | λmax         |
    | distance    | 1-d histogram | variance tr Σ  | Hessian trace|
    | ‖g‖         | 2-d histogram | CABS           | TIC          |
    +-------------+---------------+----------------+--------------+
    | HYPERPARAM. | PERFORMANCE: losses & accuracies | early stop | DIAGNOSIS: findings |
    +-------------+--------------------------------------------------------------------+
    (optional LAYERWISE row: one histogram per parameter tensor)
    legend: the colour of each layer's thin line (shared by all panels)

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
#: (group title, [(gauge name, column span)], relative group width) of the bottom row.
BOTTOM = (
    ("HYPERPARAMETERS", (("hyperparameters", 1),), 1),
    ("PERFORMANCE", (("performance", 2), ("early_stopping", 1)), 3),
    ("DIAGNOSIS", (("findings", 1),), 2),
)


def _suptitle(run, title):
    record = run.record
    first, last = data.step_range(record)
    parts = [title or f"cockpit-lite · {run.name}", f"steps {first}–{last} ({len(record)} logged)"]
    seconds = data.wall_time(record)
    if math.isfinite(seconds) and seconds > 0:
        parts.append(f"{seconds:.1f} s wall, {(last - first) / seconds:.2f} steps/s")
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

        width, height = self.figsize
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

        rows = [3.0, 1.15] + ([1.3] if self.layerwise else []) + ([1.0] if self.extra else [])
        outer = fig.subfigures(len(rows), 1, height_ratios=rows, hspace=0.01)
        upper = outer[0].subfigures(1, len(LAYOUT), wspace=0.008)
        for sub, (group, names_in_group) in zip(upper, LAYOUT):
            sub.set_facecolor(style.GROUP_COLORS.get(group, "white"))
            sub.suptitle(group, fontsize=10, fontweight="bold")
            axes = sub.subplots(len(names_in_group), 1)
            for name, ax in zip(names_in_group, axes):
                self._draw_gauge(name, record, ax, common)

        lower = outer[1].subfigures(1, len(BOTTOM), width_ratios=[w for *_, w in BOTTOM], wspace=0.008)
        for sub, (group, members, _) in zip(lower, BOTTOM):
            sub.set_facecolor(style.GROUP_COLORS.get(group, "white"))
            sub.suptitle(group, fontsize=10, fontweight="bold")
            grid = sub.add_gridspec(1, sum(span for _, span in members))
            column = 0
            for name, span in members:
                ax = sub.add_subplot(grid[0, column:column + span])
                column += span
                self._draw_gauge(name, record, ax, common)
        findings.mark(record, self.axes)

        if self.layerwise:
            from .gauges.histogram_2d import layerwise_grid

            sub = outer[2]
            sub.set_facecolor(style.GROUP_COLORS["LAYERWISE"])
            sub.suptitle("LAYERWISE", fontsize=10, fontweight="bold")  # layerwise_grid names the step
            self.axes["layerwise"] = layerwise_grid(record, sub, params=names, log_steps=self.log_steps,
                                                    marginals=False)

        if self.extra:
            from .gauges import any_quantity

            sub = outer[-1]
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

        Returns the path written.
        """
        fig = self.draw(source)
        path = os.fspath(path)
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        savefig_kwargs.setdefault("dpi", self.dpi)
        fig.savefig(path, **savefig_kwargs)
        return path


def render(source, path, **dashboard_options):
    """Render ``source`` to ``path`` with a default ``Dashboard``; returns the path."""
    return Dashboard(**dashboard_options).save(source, path)
