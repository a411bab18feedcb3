"""The gauges: one function per Cockpit instrument, registered in ``GAUGES``.

Every gauge is ``gauge(record, ax, **options) -> None``: it reads the record and
draws on one matplotlib Axes. A gauge whose quantity is absent from the record
draws a "not tracked" message in its panel (it never disappears), and key numbers
go into the panel title. Unknown options are ignored, so a layout can pass common
options (``params=`` layer names, ``log_steps=``) to every gauge.

Adding a gauge: write ``instruments/gauges/<name>.py`` with ``TITLE``, ``KEYS``
and ``gauge`` (and ``has_data(record)`` if "some key is present" is not the right
test), then add one line to ``_MODULES`` (and to a dashboard group in
``instruments.dashboard.LAYOUT`` if it should appear there). The dashboard draws a
gauge only when ``Gauge.has_data(record)`` holds.
"""

from . import (
    alpha,
    cabs,
    dead_units,
    distance,
    early_stopping,
    findings,
    grad_norm,
    grad_ratio,
    grad_variance,
    gradient_tests,
    hess_trace,
    histogram_1d,
    histogram_2d,
    hyperparameters,
    max_ev,
    mean_gsnr,
    performance,
    saturation,
    tic,
    update_ratio,
)
from ._gauge import Gauge


_MODULES = {
    "alpha": alpha,
    "distance": distance,
    "grad_norm": grad_norm,
    "gradient_tests": gradient_tests,
    "histogram_1d": histogram_1d,
    "histogram_2d": histogram_2d,
    "max_ev": max_ev,
    "hess_trace": hess_trace,
    "tic": tic,
    "mean_gsnr": mean_gsnr,
    "grad_variance": grad_variance,
    "cabs": cabs,
    "early_stopping": early_stopping,
    "hyperparameters": hyperparameters,
    "performance": performance,
    "findings": findings,
    "dead_units": dead_units,
    "saturation": saturation,
    "grad_ratio": grad_ratio,
    "update_ratio": update_ratio,
}

#: name -> Gauge, in dashboard order.
GAUGES = {
    name: Gauge(name, module.gauge, module.TITLE, tuple(module.KEYS), (module.__doc__ or "").strip(),
                getattr(module, "has_data", None))
    for name, module in _MODULES.items()
}


def draw(name, record, ax, **options):
    """Draw the gauge called ``name`` on ``ax``."""
    try:
        gauge = GAUGES[name]
    except KeyError:
        raise KeyError(f"unknown gauge {name!r}; known: {', '.join(GAUGES)}") from None
    return gauge.draw(record, ax, **options)


__all__ = ["GAUGES", "Gauge", "draw"] + list(_MODULES)
