"""Each integration without its package: an ImportError that names the extra to install."""

import importlib
import sys

import pytest


@pytest.mark.parametrize("module,package,extra", [
    ("cockpit_lite.integrations.lightning", "lightning.pytorch", "lightning"),
    ("cockpit_lite.integrations.huggingface", "transformers", "hf"),
    ("cockpit_lite.integrations.huggingface", "accelerate", "hf"),
])
def test_missing_package_names_the_extra(monkeypatch, module, package, extra):
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, package, None)  # "import package" raises ImportError
    with pytest.raises(ImportError, match=rf"pip install \"\.\[{extra}\]\""):
        importlib.import_module(module)


def test_a_torchvision_built_for_another_torch_names_the_fix(monkeypatch):
    """The clash BackPACK brings (its torchvision wheel, imported by torchmetrics for Lightning):
    an ImportError that names ``pip uninstall -y torchvision``, not the bare RuntimeError."""
    from cockpit_lite import integrations

    def broken(name):
        raise RuntimeError("operator torchvision::nms does not exist")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ImportError, match="pip uninstall -y torchvision"):
        integrations.require("lightning.pytorch", "lightning")


def test_the_package_imports_without_any_extra():
    code = ("import sys; import cockpit_lite.integrations, cockpit_lite.integrations.sinks; "
            "assert not {'lightning', 'transformers', 'tensorboard'} & set(sys.modules)")
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)
