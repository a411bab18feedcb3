"""``require``: an optional integration's package, or an ImportError naming the extra to install."""

def require(module, extra):
    """Import ``module``; if it is missing, raise ImportError naming the extra to install
    and the distribution: the top-level name (``lightning`` for ``lightning.pytorch``)."""
    import importlib

    try:
        return importlib.import_module(module)
    except RuntimeError as error:  # a torchvision built for another torch, imported by the package
        if "torchvision" not in str(error):
            raise
        raise ImportError(
            f"{module} failed to import because it imports a torchvision built for another torch "
            f"({error}); cockpit-lite never needs torchvision. Fix: pip uninstall -y torchvision "
            "(or install the torchvision built for your torch)"
        ) from error
    except ImportError as error:
        raise ImportError(
            f"{module} is not installed; this integration needs it: in a clone of cockpit-lite, "
            f"pip install \".[{extra}]\" (or pip install {module.partition('.')[0]})"
        ) from error
