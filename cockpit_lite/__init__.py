"""cockpit-lite: see inside PyTorch training.

``Cockpit`` collects per-sample gradient statistics, curvature and step-size
diagnostics during the ordinary backward pass; ``instruments`` renders them.

Submodules are imported lazily so that reading a log (``cockpit_lite.log``) does
not import torch.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "Cockpit": ("cockpit_lite.cockpit", "Cockpit"),
    "CockpitPlotter": ("instruments.plotter", "CockpitPlotter"),  # Cockpit's `from cockpit import CockpitPlotter`
    "configuration": ("cockpit_lite.utils.configuration", "configuration"),
    "extend": ("cockpit_lite.backend", "extend"),
    "quantities": ("cockpit_lite.quantities", None),
    "schedules": ("cockpit_lite.schedules", None),
    "histogram": ("cockpit_lite.histogram", None),
    "log": ("cockpit_lite.log", None),
    "diagnose": ("cockpit_lite.diagnosis", "diagnose"),
    "Finding": ("cockpit_lite.diagnosis", "Finding"),
    "checks": ("cockpit_lite.checks", None),
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'cockpit_lite' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
