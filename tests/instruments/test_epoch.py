"""EpochPlotter writes one PNG per epoch in the background and barely blocks the caller."""

import copy
import os

import pytest
from conftest import FAST
from matplotlib.image import imread

from instruments import EpochPlotter


class LiveCockpit:
    def __init__(self, record):
        self.record = record

    def get_output(self):
        return self.record


def test_thread_mode_writes_every_epoch(tmp_path, full_record):
    live = LiveCockpit({})
    steps = sorted(full_record)
    with EpochPlotter(tmp_path, savename="cp", mode="thread", **FAST) as plotter:
        for epoch in range(2):
            for step in steps[epoch * 30:(epoch + 1) * 30]:  # "training" appends to the live record
                live.record[step] = full_record[step]
            path = plotter.plot(live, epoch=epoch)
            assert path == os.path.join(tmp_path, f"cp__epoch_{epoch:03d}.png")
    for epoch in range(2):
        assert imread(tmp_path / f"cp__epoch_{epoch:03d}.png").shape[:2] == (400, 640)
    summary = plotter.summary()
    assert summary["calls"] == 2
    # queuing a snapshot is far cheaper than rendering
    assert summary["blocked_max_s"] < 0.5 * summary["render_mean_s"]


def test_snapshot_isolates_later_steps(tmp_path, full_record):
    """The plotted snapshot keeps the values of the time of ``plot``; the live record (a deep
    copy: the session fixture stays untouched) changes afterwards."""
    live = LiveCockpit(copy.deepcopy({s: e for s, e in full_record.items() if s < 10}))
    old_alpha = live.record[9]["Alpha"]
    assert old_alpha != 99.0
    plotter = EpochPlotter(tmp_path, mode="sync", **FAST)
    plotter._render = lambda run, path, timing: captured.append(run)  # capture instead of drawing
    captured = []
    plotter.plot(live)
    live.record[10] = copy.deepcopy(full_record[10])
    live.record[9]["Alpha"] = 99.0
    assert max(captured[0].record) == 9
    assert captured[0].record[9]["Alpha"] == old_alpha
    assert full_record[9]["Alpha"] == old_alpha


def test_process_mode_is_the_default(tmp_path, full_record):
    with EpochPlotter(tmp_path, savename="proc", **FAST) as plotter:
        assert plotter.mode == "process"
        plotter.plot(full_record, savename_append="_x")
    assert imread(tmp_path / "proc_x.png").shape[:2] == (400, 640)
    assert plotter.summary()["blocked_max_s"] < 0.5 * plotter.summary()["render_mean_s"]


def test_drawable_keeps_only_what_is_drawn(full_record):
    from instruments import data

    pruned = data.drawable(full_record)
    assert "Parameters" not in pruned[0]
    assert [s for s, e in pruned.items() if "GradHist1d" in e] == [55]
    assert [s for s, e in pruned.items() if "GradHist2d" in e.get("layers", {})] == [50]
    assert pruned[3] is full_record[3]  # untouched entries are shared
    assert "GradHist1d" in full_record[0]  # the original is unchanged


def test_background_errors_surface(tmp_path):
    plotter = EpochPlotter(tmp_path, mode="thread", **FAST)
    plotter.plot(str(tmp_path / "missing.jsonl"))
    with pytest.warns(RuntimeWarning, match="failed"):
        with pytest.raises(FileNotFoundError):
            plotter.close()


def test_sync_mode_and_bad_mode(tmp_path, economy_record):
    plotter = EpochPlotter(tmp_path, mode="sync", **FAST)
    path = plotter.plot(economy_record)
    assert os.path.exists(path) and path.endswith("cockpit__epoch_000.png")
    with pytest.raises(ValueError):
        EpochPlotter(tmp_path, mode="fork")


def test_incremental_snapshot(full_record):
    from instruments import data

    live = {s: dict(e) for s, e in full_record.items() if s < 10}
    first = data.snapshot(live)
    live[9]["Alpha"] = 0.5  # a two-step quantity arriving one step late
    live[10] = dict(full_record[10])
    second = data.snapshot(live, previous=first)
    assert sorted(second) == list(range(11))
    assert second[9]["Alpha"] == 0.5 and second[10] is not live[10]
    assert second[0] is first[0]  # settled steps are not copied again
    assert second[9] is not live[9]


# ----------------------------------------------------------------------------- atomic pictures


@pytest.fixture
def killed_while_saving(monkeypatch):
    """``Figure.savefig`` writes half a PNG and then the process 'dies' (an exception in place of SIGKILL)."""
    from matplotlib.figure import Figure

    class Killed(BaseException):
        pass

    def savefig(self, fname, **kwargs):
        with open(fname, "wb") as file:
            file.write(b"\x89PNG\r\n\x1a\n half a picture")
        raise Killed()

    monkeypatch.setattr(Figure, "savefig", savefig)
    return Killed


@pytest.mark.parametrize("mode", ["sync", "thread"])
def test_a_render_killed_while_saving_leaves_no_truncated_png(tmp_path, economy_record, killed_while_saving, mode):
    final = tmp_path / "cp__epoch_000.png"
    final.write_bytes(b"the previous, complete picture")
    plotter = EpochPlotter(tmp_path, savename="cp", mode=mode, **FAST)
    if mode == "thread":  # the background thread dies: run its render directly to see the exception
        with pytest.raises(killed_while_saving):
            plotter._render(plotter._snapshot(economy_record), str(final), {})
    else:
        with pytest.raises(killed_while_saving):
            plotter.plot(economy_record, epoch=0)
    assert final.read_bytes() == b"the previous, complete picture"
    assert os.listdir(tmp_path) == ["cp__epoch_000.png"]  # the temporary file is gone too


def test_the_render_worker_killed_by_sigkill_never_leaves_a_truncated_png(tmp_path, economy_record):
    """The worker process (mode="process") is SIGKILLed in the middle of writing a PNG."""
    import pickle
    import subprocess
    import sys

    from conftest import _ROOT

    final = tmp_path / "w.png"
    job = {"run": {"record": economy_record, "params": None, "name": "w"}, "path": str(final),
           "options": dict(FAST)}
    (tmp_path / "job.pkl").write_bytes(pickle.dumps(job))
    code = (
        "import os, pickle, signal, sys\n"
        "from matplotlib.figure import Figure\n"
        "def savefig(self, fname, **kw):\n"
        "    open(fname, 'wb').write(b'\\x89PNG half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "Figure.savefig = savefig\n"
        "from instruments import _worker\n"
        "_worker.render(pickle.load(open(sys.argv[1], 'rb')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "job.pkl")], cwd=_ROOT,
                            env=dict(os.environ, MPLBACKEND="Agg"), capture_output=True)
    assert result.returncode == -9, result.stderr
    assert not final.exists()  # at most a hidden temporary file, never the final name
    assert all(name.startswith(".w.") for name in os.listdir(tmp_path) if name != "job.pkl")
