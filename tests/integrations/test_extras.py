"""Each integration without its package: an ImportError that names the extra to install."""

import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module,package,extra", [
    ("cockpit_lite.integrations.lightning", "lightning.pytorch", "lightning"),
    ("cockpit_lite.integrations.huggingface", "transformers", "hf"),
    ("cockpit_lite.integrations.huggingface", "accelerate", "hf"),
])
def test_missing_package_names_the_extra(module, package, extra):
    """In a fresh interpreter: hiding a package in this one would poison the availability
    caches of the packages that are there (transformers remembers accelerate as missing)."""
    code = (
        f"import sys, importlib; sys.modules[{package!r}] = None\n"  # "import package" raises ImportError
        f"try:\n    importlib.import_module({module!r})\nexcept ImportError as error:\n    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert f'pip install ".[{extra}]"' in out, out
    # the distribution the message names is one pip can install and that provides the module
    named = re.search(r"\(or pip install ([\w.-]+)\)", out).group(1)
    top = package.partition(".")[0]
    if importlib.util.find_spec(top) is not None:
        assert named in importlib.metadata.packages_distributions().get(top, []), (named, out)
    else:
        assert named == top, out


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
    subprocess.run([sys.executable, "-c", code], check=True)
