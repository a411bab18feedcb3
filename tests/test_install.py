"""Installation: the declared torch floor, no import path that loads torchvision, and the documented remedy.

BackPACK declares a dependency on torchvision; a torchvision built for another torch
cannot load (``operator torchvision::nms does not exist``) and breaks Lightning, which
imports it whenever it is installed. cockpit-lite must never load it, and the one-line
remedy of ``docs/install.md`` (``pip uninstall -y torchvision``) must work.
"""

import os
import re
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROKEN = 'raise RuntimeError("operator torchvision::nms does not exist")\n'


def _run(python, code, **kwargs):
    return subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, **kwargs)


def test_the_torch_floor_is_what_the_code_imports():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as file:
        text = file.read()
    floor = re.search(r'"torch>=([0-9.]+)"', text).group(1)
    # torch.nn.attention.sdpa_kernel is new in 2.3, _foreach_norm(dtype=) in 2.4, grad_fn._input_metadata in
    # 2.5, register_module_forward_hook(with_kwargs=) in 2.6 (docs/install.md: the tests on each release)
    assert tuple(int(p) for p in floor.split(".")) >= (2, 6)
    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as file:
        assert f"PyTorch ≥ {floor}" in file.read()


def test_no_import_path_of_the_package_loads_torchvision():
    """cockpit_lite (a step with BackPACK curvature, the checks, the diagnosis) and instruments, with
    any attempt to import torchvision turned into an error."""
    code = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            raise ImportError("cockpit-lite imported torchvision")

sys.meta_path.insert(0, Refuse())
import torch
import cockpit_lite, cockpit_lite.checks, cockpit_lite.diagnosis, cockpit_lite.integrations.sinks
from cockpit_lite import Cockpit, configuration
import instruments, instruments.cli
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
loss_fn = torch.nn.CrossEntropyLoss()
cp = Cockpit(model, quantities=configuration("full"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
loss = loss_fn(model(x), y)
with cp(0, info={"loss": loss, "batch_size": 6, "loss_fn": loss_fn, "optimizer": opt}):
    loss.backward(create_graph=cp.create_graph(0))
opt.step()
cp.close()
assert "HessTrace" in cp.get_output()[0]
assert not [m for m in sys.modules if m.split(".")[0] == "torchvision"]
print("ok")
"""
    result = _run(sys.executable, code)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def _fake_broken_torchvision(site):
    """Install (files and a RECORD, as pip would) a torchvision that fails to load, into ``site``."""
    package, info = os.path.join(site, "torchvision"), os.path.join(site, "torchvision-0.99.0.dist-info")
    os.makedirs(package)
    os.makedirs(info)
    files = {"torchvision/__init__.py": BROKEN, "torchvision-0.99.0.dist-info/METADATA":
             "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.99.0\n",
             "torchvision-0.99.0.dist-info/INSTALLER": "pip\n"}
    for name, content in files.items():
        with open(os.path.join(site, name), "w", encoding="utf-8") as file:
            file.write(content)
    with open(os.path.join(info, "RECORD"), "w", encoding="utf-8") as file:
        file.write("".join(f"{name},,\n" for name in files) + "torchvision-0.99.0.dist-info/RECORD,,\n")


def test_pip_uninstall_torchvision_fixes_the_clash(tmp_path):
    """An environment that sees this one's packages plus a torchvision built for another torch:
    Lightning fails at import, exactly as reported; ``pip uninstall -y torchvision`` fixes it."""
    pytest.importorskip("lightning")
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = str(env_dir / "bin" / "python")
    site = _run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    with open(os.path.join(site, "base.pth"), "w", encoding="utf-8") as file:  # this environment's packages
        file.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    _fake_broken_torchvision(site)
    check = "import lightning; from cockpit_lite.integrations.lightning import CockpitCallback; print('ok')"
    before = _run(python, check)
    assert before.returncode != 0 and "torchvision::nms does not exist" in before.stderr, before.stderr[-2000:]
    remedy = subprocess.run([sys.executable, "-m", "pip", "--python", python, "uninstall", "-y", "torchvision"],
                            capture_output=True, text=True, timeout=300)
    assert remedy.returncode == 0, remedy.stderr[-2000:]
    after = _run(python, check)
    assert after.returncode == 0 and after.stdout.strip() == "ok", after.stderr[-2000:]
