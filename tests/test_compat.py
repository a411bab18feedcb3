"""Drop-in compatibility with Cockpit: its example scripts with only the imports changed, its
JSON files read both ways (against the real cockpit-for-pytorch), its import paths, and the
docs pages that show this (docs/porting.md, docs/integrations.md, the custom quantity of
docs/quantities.md: every snippet there runs here, with checks of its results)."""

import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch

import problems
from foreign_warnings import raised_as_errors
from cockpit_lite import log, quantities, schedules
from cockpit_lite.quantities import Output, SingleStepQuantity

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cockpit():
    """The original Cockpit, or a skip that says why it cannot be imported."""
    try:
        import cockpit
    except Exception as error:  # e.g. pkg_resources missing with setuptools >= 81
        pytest.skip(f"cockpit-for-pytorch cannot be imported: {error!r}")
    return cockpit


def _digits(batch_size=32, steps=3, seed=0):
    """Digits-sized random batches ([B, 1, 8, 8], 10 classes) instead of Fashion-MNIST's download."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, 1, 8, 8, generator=g), torch.randint(0, 10, (batch_size,), generator=g))
            for _ in range(steps)]


# ---------------------------------------------------------------- Cockpit's examples


def test_example_01_basic_fmnist(recwarn):
    """examples/01_basic_fmnist.py; changed: the imports, the data (and 784 -> 64 inputs), 3 steps."""
    from backpack import extend

    from cockpit_lite import Cockpit, CockpitPlotter
    from cockpit_lite.utils.configuration import configuration

    fmnist_data = _digits()
    model = extend(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)))
    loss_fn = extend(torch.nn.CrossEntropyLoss(reduction="mean"))
    individual_loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    cockpit = Cockpit(model.parameters(), quantities=configuration("full"))
    plotter = CockpitPlotter(dpi=40)

    max_steps, global_step = 3, 0
    for inputs, labels in iter(fmnist_data):
        opt.zero_grad()
        outputs = model(inputs)
        loss = loss_fn(outputs, labels)
        losses = individual_loss_fn(outputs, labels)
        with cockpit(global_step, info={"batch_size": inputs.shape[0], "individual_losses": losses,
                                        "loss": loss, "optimizer": opt}):
            loss.backward(create_graph=cockpit.create_graph(global_step))
        opt.step()
        global_step += 1
        plotter.plot(cockpit)
        if global_step >= max_steps:
            break
    plotter.plot(cockpit, block=True)

    record = cockpit.get_output()
    assert sorted(record) == [0, 1, 2]
    assert {"Alpha", "HessMaxEV", "GradHist2d", "TICDiag", "HessTrace", "NormTest"} <= set(record[1])
    assert any("non-interactive" in str(w.message) for w in recwarn)  # headless: drawn, not shown


def test_example_02_advanced_fmnist(tmp_path):
    """examples/02_advanced_fmnist.py; changed: the imports, the data, the CNN's kernels for 8x8
    inputs, 8 steps of 8 samples instead of 50 of 64 (plots every 4th step instead of 10th). Its plot from the
    written file needs the log path to win over the folder of the same name."""
    from backpack import extend, extensions

    from cockpit_lite import Cockpit, CockpitPlotter
    from cockpit_lite import quantities as q_module
    from cockpit_lite.utils import schedules as cockpit_schedules

    def cnn():
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 11, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2, 2),
            torch.nn.Conv2d(11, 16, 2), torch.nn.ReLU(), torch.nn.MaxPool2d(2, 2),
            torch.nn.Flatten(), torch.nn.Linear(16, 80), torch.nn.ReLU(),
            torch.nn.Linear(80, 84), torch.nn.ReLU(), torch.nn.Linear(84, 10),
        )

    def get_logpath(suffix=""):
        save_dir = os.path.join(tmp_path, "logfiles")
        os.makedirs(save_dir, exist_ok=True)
        return os.path.join(save_dir, f"cockpit_output{suffix}")

    fmnist_data = _digits(batch_size=8, steps=8)
    torch.manual_seed(0)
    model = extend(cnn())
    loss_fn = extend(torch.nn.CrossEntropyLoss(reduction="mean"))
    individual_loss_fn = extend(torch.nn.CrossEntropyLoss(reduction="none"))
    opt = torch.optim.SGD(model.parameters(), lr=5e-1)
    quantities = [
        q_module.GradNorm(cockpit_schedules.linear(interval=1)),
        q_module.Distance(cockpit_schedules.linear(interval=1)),
        q_module.UpdateSize(cockpit_schedules.linear(interval=1)),
        q_module.HessMaxEV(cockpit_schedules.linear(interval=3)),
        q_module.GradHist1d(cockpit_schedules.linear(interval=10), bins=10),
    ]
    cockpit = Cockpit(model.parameters(), quantities=quantities)
    plotter = CockpitPlotter(dpi=40)

    max_steps, global_step = 8, 0
    for inputs, labels in iter(fmnist_data):
        opt.zero_grad()
        outputs = model(inputs)
        loss = loss_fn(outputs, labels)
        losses = individual_loss_fn(outputs, labels)
        with cockpit(global_step, extensions.DiagHessian(), info={
            "batch_size": inputs.shape[0], "individual_losses": losses, "loss": loss, "optimizer": opt,
        }):
            loss.backward(create_graph=cockpit.create_graph(global_step))
        assert all(hasattr(p, "diag_h") for p in model.parameters())  # the user's extension stays
        opt.step()
        global_step += 1
        if global_step % 4 == 0:
            plotter.plot(cockpit, savedir=get_logpath(), show_plot=False, save_plot=True,
                         savename_append=str(global_step))
        if global_step >= max_steps:
            break

    cockpit.write(get_logpath())
    plotter.plot(get_logpath(), savedir=get_logpath(), show_plot=False, save_plot=True, savename_append="_final")

    saved = sorted(os.listdir(get_logpath()))
    assert saved == sorted(["cockpit__primary__4.png", "cockpit__primary__8.png", "cockpit__primary___final.png"])
    record = log.read_json(get_logpath() + ".json")
    assert sorted(s for s in record if "HessMaxEV" in record[s]) == [0, 3, 6]
    assert sorted(s for s in record if "GradHist1d" in record[s]) == [0]
    assert record[0]["GradHist1d"]["hist"].shape == (10,)


# ---------------------------------------------------------------- JSON, both ways


def _train_cockpit(cockpit_module, steps=3):
    """The original Cockpit on a tiny extended MLP, every quantity of "full", one epoch logged."""
    from backpack import extend
    from cockpit.utils.configuration import configuration

    torch.manual_seed(0)
    model = extend(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)))
    lossfunc, individual = extend(torch.nn.CrossEntropyLoss()), torch.nn.CrossEntropyLoss(reduction="none")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = cockpit_module.Cockpit(model.parameters(), quantities=configuration("full"))
    for step in range(steps):
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        opt.zero_grad()
        out = model(x)
        loss = lossfunc(out, y)
        with cp(step, info={"batch_size": 8, "individual_losses": individual(out, y), "loss": loss, "optimizer": opt}):
            loss.backward(create_graph=cp.create_graph(step))
        opt.step()
    cp.log(steps - 1, 0, 1.0, 1.1, 1.2, 0.5, 0.4, 0.3, 0.1)
    return cp


def _plain(value):
    if torch.is_tensor(value):
        return value.detach().cpu().numpy()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def test_reads_a_json_written_by_cockpit(tmp_path):
    cockpit = _cockpit()
    cp = _train_cockpit(cockpit)
    with redirect_stdout(io.StringIO()):
        cp.write(str(tmp_path / "cockpit_run"))
    expected = {int(s): _plain(e) for s, e in cp.get_output().items()}
    record = log.read_json(tmp_path / "cockpit_run.json")
    assert sorted(record) == sorted(expected) == [0, 1, 2]
    for step, entry in expected.items():
        assert set(record[step]) == set(entry)
        for key, value in entry.items():
            if isinstance(value, dict):  # histograms: arrays again, also the 2-d edges
                np.testing.assert_array_equal(record[step][key]["hist"], value["hist"])
                got, want = record[step][key]["edges"], value["edges"]
                got, want = (got, want) if isinstance(want, list) else ([got], [want])
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(g, w)
            else:
                assert record[step][key] == pytest.approx(value, nan_ok=True)
    from instruments import CockpitPlotter

    path = CockpitPlotter(dpi=40).plot(str(tmp_path / "cockpit_run"), show_plot=False, save_plot=True, debug=True)
    assert path == str(tmp_path / "cockpit_run" / "cockpit__primary.png") and os.path.isfile(path)


def test_cockpits_plotter_reads_our_json(tmp_path):
    cockpit = _cockpit()
    import json_tricks

    from cockpit_lite import Cockpit, configuration

    problem = problems.make("mlp", 5)
    # Cockpit 1.0.2's plotter raises on TICTrace, which none of its levels tracks
    # (tic_gauge.py reads self.cmap_backup, never set): leave it out
    cp, _ = problems.run(problem, [q for q in configuration("full") if q.name != "TICTrace"])
    cp.log(2, 0, 1.0, 1.1, 1.2, 0.5, 0.4, 0.3, 0.1)
    assert isinstance(cp, Cockpit)
    path = cp.write(tmp_path / "lite_run")
    with open(path) as file:
        loaded = json_tricks.load(file)
    np.testing.assert_array_equal(loaded["1"]["GradHist2d"]["hist"], cp.get_output()[1]["GradHist2d"]["hist"])
    assert isinstance(loaded["1"]["GradHist1d"]["edges"], np.ndarray)
    with redirect_stdout(io.StringIO()):
        cockpit.CockpitPlotter().plot(str(tmp_path / "lite_run"), show_plot=False, save_plot=True,
                                      savedir=str(tmp_path / "figures"))
    assert os.path.isfile(tmp_path / "figures" / "cockpit__primary.png")


# ---------------------------------------------------------------- import paths, API details


@pytest.mark.parametrize("first", [
    "import cockpit_lite.utils.configuration",
    "from cockpit_lite import configuration",
    "from cockpit_lite.utils.configuration import configuration",
])
def test_configuration_is_the_function_whatever_was_imported_first(first):
    code = (
        f"{first}\n"
        "import cockpit_lite, cockpit_lite.utils.configuration as module\n"
        "from cockpit_lite import configuration\n"
        "from cockpit_lite.utils.configuration import configuration as same, quantities_cls_for_configuration\n"
        "from cockpit_lite.utils import schedules\n"
        "assert callable(configuration) and configuration is same is cockpit_lite.configuration\n"
        "assert type(module).__name__ == 'module' and len(configuration('full')) == len(quantities_cls_for_configuration('full'))\n"
        "assert schedules.linear(2)(4) and not schedules.logarithmic(0, 2, steps=3)(3)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_a_cockpit_style_quantity_fails_when_defined():
    with pytest.raises(TypeError, match=r"defines _compute, extensions.*needs\(step, info\)"):
        class MyNorm(quantities.GradNorm):  # noqa: F841
            def extensions(self, global_step):
                return []

            def _compute(self, global_step, params, batch_loss):
                return 0.0


def test_a_quantity_that_skips_the_base_init_is_refused():
    from cockpit_lite import Cockpit

    class Forgetful(SingleStepQuantity):
        def __init__(self):
            pass

    with pytest.raises(ValueError, match=r"super\(\).__init__"):
        Cockpit(torch.nn.Linear(2, 2), [Forgetful()])


def test_per_quantity_get_output_and_debug(capsys):
    problem = problems.make("mlp", 5)
    alpha, norm_test = quantities.Alpha(), quantities.NormTest(schedules.linear(2))
    cp, _ = problems.run(problem, [alpha, norm_test])
    record = cp.get_output()
    assert norm_test.get_output() == {s: record[s]["NormTest"] for s in (0, 2)}
    assert alpha.get_output() == {s: e["Alpha"] for s, e in record.items() if "Alpha" in e}
    assert sorted(alpha.get_output()) == [0, 1]  # two-step: known one step later

    from cockpit_lite import Cockpit

    model = torch.nn.Linear(3, 2)
    cp = Cockpit(model, [quantities.GradNorm()])
    loss = model(torch.randn(4, 3)).pow(2).mean()
    with cp(0, info={"loss": loss}, debug=True):
        loss.backward()
    out = capsys.readouterr().out
    assert "[cockpit-lite | step 0] due: ['GradNorm'" in out and "recorded at step 0: ['GradNorm'" in out


def test_backpack_advice_only_when_backpack_runs():
    """An AttributeError in the ``with`` block gets the "BackPACK lost a layer's input" note
    only when BackPACK extensions were active at that step."""
    from cockpit_lite import Cockpit

    problem = problems.make("mlp", 5)
    x, y = problem.batches[0]

    def fail(qs):
        cp = Cockpit(problem.model, qs)
        loss = problem.lossfunc(problem.model(x), y)
        with pytest.raises(AttributeError) as info:
            with cp(0, info={"loss": loss}):
                raise AttributeError("'Linear' object has no attribute 'input0'")
        return "".join(getattr(info.value, "__notes__", []))

    assert "BackPACK" not in fail([quantities.NormTest(), quantities.GradNorm()])
    assert "BackPACK lost a layer's stored input" in fail([quantities.HessTrace()])


# ---------------------------------------------------------------- the docs' snippets


def _doc_snippets():
    """The python blocks of docs/porting.md, docs/integrations.md and the custom quantity
    of docs/quantities.md (tests/test_docs.py runs the other blocks of the docs)."""
    def blocks(page, start=None, end=None):
        with open(os.path.join(ROOT, "docs", page), encoding="utf-8") as file:
            text = file.read()
        if start is not None:
            text = text[text.index(start):text.index(end) if end else None]
        return re.findall(r"```python\n(.*?)```", text, flags=re.S)

    return (blocks("porting.md") + blocks("quantities.md", "## Custom quantities")
            + blocks("integrations.md"))


SNIPPETS = _doc_snippets()


def test_the_docs_have_their_snippets():
    assert len(SNIPPETS) == 5  # porting, custom quantity, integrations (3)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, tmp_path, monkeypatch):
    code = SNIPPETS[index]
    for package, extra in (("lightning", "lightning"), ("transformers", "hf"), ("tensorboard", "tensorboard")):
        if f"{package}" in code and f"integrations.{'huggingface' if extra == 'hf' else package}" in code:
            pytest.importorskip(package, reason=f"the {extra} extra is not installed")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    with redirect_stdout(io.StringIO()), raised_as_errors():
        exec(compile(code, f"docs snippet {index}", "exec"), namespace)
    if "OpposingFraction" in namespace:
        _check_opposing_fraction(namespace["OpposingFraction"], tmp_path)
    if "plotter" in namespace:
        assert os.path.isfile(tmp_path / "logfiles" / "cockpit_output" / "cockpit__primary__final.png")


def _check_opposing_fraction(cls, tmp_path):
    """The docs' custom quantity against brute force, and its dashboard panel."""
    assert os.path.isfile(tmp_path / "runs" / "cockpit__primary.png")
    for case in [("mlp", 5, "mean"), ("cnn", 2, "sum"), ("gpt", 4, "mean")]:
        problem = problems.make(*case)
        cp, snapshots = problems.run(problem, [cls()])
        for step, snapshot in snapshots.items():
            grads = problems.individual_gradients(problem, snapshot)
            flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1)
            expected = (flat @ flat.mean(0) < 0).double().mean().item()
            layers = [(g.reshape(g.shape[0], -1) @ g.reshape(g.shape[0], -1).mean(0) < 0).double().mean().item()
                      for g in grads]
            assert cp.get_output()[step]["OpposingFraction"] == pytest.approx(expected)
            assert cp.get_output()[step]["layers"]["OpposingFraction"] == pytest.approx(layers)
