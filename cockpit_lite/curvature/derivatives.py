"""Derivatives of backward operators that PyTorch lacks (``sdpa``: the CPU flash attention's) or gets
wrong (``weight_norm``: the fused weight norm's), registered once per process before the Cockpit's
first Hessian-vector product (``enable``), so that a product through them is the Hessian's."""

import torch

_LIBRARIES = {}  # operator -> the torch.library.Library holding its registration (kept alive)


def register(operator, kernel, keys):
    """Make ``kernel`` the implementation of ``aten::operator`` for the dispatch ``keys`` (once).

    Returns:
        ``True`` (the registration is in place).
    """
    if operator not in _LIBRARIES:
        library = torch.library.Library("aten", "IMPL")
        for key in keys:
            library.impl(operator, kernel, key)
        _LIBRARIES[operator] = library
    return True


def enable():
    """Register every derivative of this module's docstring (once per process).

    Returns:
        ``{module name: whether its registration is in place}`` (``False`` on a PyTorch without
        its operator).
    """
    from cockpit_lite.curvature import sdpa, weight_norm

    return {module.__name__.rsplit(".", 1)[1]: module.enable_double_backward(register) for module in (sdpa, weight_norm)}
