"""TensorBoardSink: what the event file holds equals the record."""

import sys

import numpy as np
import pytest
import torch

from cockpit_lite import Cockpit, configuration, quantities

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install '.[tensorboard]' in a clone of cockpit-lite)")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from cockpit_lite.integrations.tensorboard import TensorBoardSink  # noqa: E402


def _train(sinks, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, configuration("economy") + [quantities.GradHist2d(per_layer=True)], sinks=sinks, strict=True)
    for step in range(steps):
        x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    cp.log(steps - 1, 0, 1.5, 1.6, 1.7, 0.3, 0.2, 0.1, 0.1)
    cp.close()
    return cp


def test_event_file_holds_the_record(tmp_path):
    cp = _train([TensorBoardSink(tmp_path)])
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0}).Reload()
    record = cp.get_output()
    tags = events.Tags()

    loss = {e.step: e.value for e in events.Scalars("cockpit/Loss")}
    assert loss == pytest.approx({s: record[s]["Loss"] for s in record if "Loss" in record[s]}, rel=1e-6)
    norm_test = {e.step: e.value for e in events.Scalars("cockpit/NormTest/layers/0.weight")}
    assert norm_test[1] == pytest.approx(record[1]["layers"]["NormTest"][0], rel=1e-6)
    grad_norm = {e.step: e.value for e in events.Scalars("cockpit/GradNorm/2.bias")}
    assert grad_norm[2] == pytest.approx(record[2]["GradNorm"][3], rel=1e-6)
    alpha = {e.step: e.value for e in events.Scalars("cockpit/Alpha")}
    assert sorted(alpha) == [s for s in sorted(record) if "Alpha" in record[s]]  # two-step: one step late
    assert events.Scalars("cockpit/train_loss")[0].value == pytest.approx(1.5)

    hist = {e.step: e.histogram_value for e in events.Histograms("cockpit/GradHist1d")}
    value = record[2]["GradHist1d"]
    np.testing.assert_array_equal(np.asarray(hist[2].bucket), np.asarray(value["hist"], dtype=float))
    np.testing.assert_allclose(hist[2].bucket_limit, value["edges"][1:])
    marginal = {e.step: e.histogram_value for e in events.Histograms("cockpit/GradHist2d/param")}
    np.testing.assert_array_equal(np.asarray(marginal[0].bucket), np.asarray(record[0]["GradHist2d"]["hist"]).sum(0))
    assert "cockpit/GradHist2d/layers/0.weight/grad" in tags["histograms"]


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install \"\.\[tensorboard\]\""):
        TensorBoardSink("unused")


def test_failing_sink_warns_and_training_goes_on():
    class Broken:
        def write(self, step, entries, names):
            raise OSError("disk full")

        def close(self):
            pass

    with pytest.warns(UserWarning, match="sink Broken failed at step 0"):
        model = torch.nn.Linear(3, 2)
        cp = Cockpit(model, [quantities.Loss()], sinks=[Broken()])
        loss = model(torch.randn(4, 3)).sum()
        with cp(0, info={"loss": loss}):
            loss.backward()
    assert cp.get_output()[0]["Loss"] == pytest.approx(loss.item())
