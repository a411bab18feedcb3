"""instruments: draw cockpit-lite records.

Reads records only (``cockpit_lite.log``): never imports torch or model code, and
never talks to a Cockpit while it trains beyond calling ``get_output()``. All
drawing uses ``matplotlib.figure.Figure`` (no pyplot state), so rendering works
headless and from background threads.

Public API
----------
- ``CockpitPlotter().plot(source, show_plot=..., save_plot=..., savedir=...,
  savename=..., savename_append=...)``: Cockpit-compatible entry point.
- ``Dashboard(...).draw(source)`` -> Figure; ``.save(source, path)``;
  ``render(source, path)``: the gauges of what the record holds, in groups (step
  size, gradients, gradient noise, curvature, layer health, hyperparameters,
  performance, diagnosis); ``plan(record)`` says which.
- ``compare(sources, labels=..., rows=("alpha", "performance"), savepath=...)``:
  several runs side by side.
- ``EpochPlotter(savedir, savename, mode="process")``: ``.plot(cockpit)`` once per
  epoch returns in well under a millisecond and writes the PNG in a render
  process (``"thread"`` and ``"sync"`` modes too; ``python -m
  instruments.benchmark RUN.jsonl`` measures them).
- ``GAUGES`` / ``draw_gauge(name, record, ax, **options)``: the single gauges,
  each ``gauge(record, ax, **options)`` (modules under ``instruments.gauges``).
- ``load(source)`` -> ``Run``: a record from a dict, log path or live cockpit.
- CLI: ``python -m instruments RUN.jsonl -o dashboard.png`` and
  ``python -m instruments a.jsonl b.jsonl --compare -o cmp.png``.
"""

from .compare import compare
from .dashboard import BOTTOM, HEALTH, LAYOUT, Dashboard, plan, render
from .data import Run, load
from .epoch import EpochPlotter
from .gauges import GAUGES, Gauge
from .gauges import draw as draw_gauge
from .plotter import CockpitPlotter

__all__ = [
    "BOTTOM",
    "CockpitPlotter",
    "Dashboard",
    "EpochPlotter",
    "GAUGES",
    "Gauge",
    "HEALTH",
    "LAYOUT",
    "Run",
    "compare",
    "draw_gauge",
    "load",
    "plan",
    "render",
]
