"""CockpitPlotter accepts every source kind and names its files like Cockpit."""

import os

import pytest
from conftest import FAST
from figure_text import all_titles
from matplotlib.image import imread

from cockpit_lite.log import write_json
from instruments import CockpitPlotter

import records


class LiveCockpit:
    """The part of a cockpit the plotter uses."""

    def __init__(self, record, names=None):
        self._record = record
        if names is not None:
            self.param_names = names

    def get_output(self):
        return self._record


def _plot(source, tmp_path, **kwargs):
    plotter = CockpitPlotter(**FAST)
    path = plotter.plot(source, show_plot=False, save_plot=True, **kwargs)
    return plotter, path


def test_live_cockpit(tmp_path, full_record, names):
    plotter, path = _plot(LiveCockpit(full_record, names), tmp_path, savedir=tmp_path, savename_append="epoch_03")
    assert path == os.path.join(tmp_path, "cockpit__primary__epoch_03.png")  # Cockpit's name
    assert os.path.exists(path)
    legend = [t.get_text() for t in plotter.fig.legends[0].get_texts()]
    assert legend[1] == names[0]


def test_record_dict_with_string_steps(tmp_path, economy_record):
    source = {str(k): v for k, v in economy_record.items()}
    plotter = CockpitPlotter(**FAST)
    assert plotter.plot(source, show_plot=False) is None
    assert any(t.startswith("α, last 10%") for t in all_titles(plotter.fig))
    assert plotter.save_path(source, savedir=tmp_path, savename="econ") == os.path.join(tmp_path, "econ__primary.png")


def test_jsonl_path_defaults_to_a_folder_named_like_the_log(tmp_path, full_jsonl):
    plotter, path = _plot(full_jsonl, tmp_path)
    assert path == os.path.join(tmp_path, "run", "cockpit__primary.png")  # Cockpit: savedir = the log path
    assert imread(path).shape[:2] == (400, 640)
    legend = [t.get_text() for t in plotter.fig.legends[0].get_texts()]
    assert legend[1:] == records.NAMES  # names from the log header


def test_json_path_and_path_without_extension(tmp_path, full_record):
    write_json(tmp_path / "old.json", full_record)
    plotter = CockpitPlotter(**FAST)
    plotter.plot(str(tmp_path / "old"), show_plot=False)  # Cockpit passes the log path without ".json"
    assert any(t.startswith("λmax") for t in all_titles(plotter.fig))
    assert plotter.save_path(str(tmp_path / "old")) == os.path.join(tmp_path, "old", "cockpit__primary.png")
    assert plotter.save_path(str(tmp_path / "old.json"), fmt="pdf") == os.path.join(tmp_path, "old", "cockpit__primary.pdf")


def test_log_path_next_to_a_folder_of_the_same_name(tmp_path, full_record):
    """Cockpit's advanced example saves figures into ``logpath/`` and then plots ``logpath``
    (which is ``logpath.json``): the folder must not be taken for the log."""
    logpath = str(tmp_path / "cockpit_output")
    plotter, first = _plot(full_record, tmp_path, savedir=logpath, savename_append="10")
    assert first == os.path.join(logpath, "cockpit__primary__10.png")
    write_json(logpath + ".json", full_record)
    _, final = _plot(logpath, tmp_path, savedir=logpath, savename_append="_final")
    assert final == os.path.join(logpath, "cockpit__primary___final.png")
    assert os.path.isfile(final)


def test_build_animation_from_the_log_in_hindsight(tmp_path, full_record):
    from PIL import Image

    write_json(tmp_path / "run.json", full_record)
    path = CockpitPlotter(**FAST).build_animation(str(tmp_path / "run"), duration=100, steps=[5, 59])
    assert path == str(tmp_path / "run__primary.gif")
    with Image.open(path) as gif:
        assert gif.n_frames == 2
        assert gif.info["duration"] == 100
        first = gif.convert("RGB").tobytes()
        gif.seek(1)
        assert gif.convert("RGB").tobytes() != first  # later frames show more steps


def test_build_animation_defaults_to_the_logged_epochs(tmp_path, full_record):
    from PIL import Image

    early = {s: e for s, e in full_record.items() if s <= 25}  # epochs logged at steps 0 and 20
    write_json(tmp_path / "run.json", early)
    with Image.open(CockpitPlotter(**FAST).build_animation(str(tmp_path / "run.json"))) as gif:
        assert gif.n_frames == len([s for s in records.EPOCH_STEPS if s <= 25]) == 2


def test_live_cockpit_default_savedir_is_cwd(economy_record):
    assert CockpitPlotter().save_path(LiveCockpit(economy_record)) == os.path.join(".", "cockpit__primary.png")


def test_discard_and_title(full_record):
    plotter = CockpitPlotter(**FAST)
    plotter.plot(full_record, show_plot=False, discard=30, plot_title="my run")
    assert plotter.fig._suptitle.get_text().startswith("my run")
    assert "steps 0–30" in plotter.fig._suptitle.get_text()


def test_no_save_returns_none(full_record):
    assert CockpitPlotter(**FAST).plot(full_record, show_plot=False) is None


def test_show_plot_headless_warns(full_record):
    with pytest.warns(UserWarning, match="non-interactive"):
        CockpitPlotter(**FAST).plot(full_record, show_plot=True, block=False)


def test_bad_source():
    with pytest.raises(TypeError, match="get_output"):
        CockpitPlotter().plot(42, show_plot=False)
    with pytest.raises(FileNotFoundError):
        CockpitPlotter().plot("/nonexistent/run", show_plot=False)


def test_saving_is_atomic(tmp_path, economy_record, monkeypatch):
    """A failure (or a kill) while saving leaves the previous picture, never a truncated one."""
    from matplotlib.figure import Figure

    from instruments import compare

    def savefig(self, fname, **kwargs):
        with open(fname, "wb") as file:
            file.write(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", savefig)
    plotter = CockpitPlotter(**FAST)
    final = tmp_path / "cockpit__primary.png"
    final.write_bytes(b"complete")
    with pytest.raises(KeyboardInterrupt):
        plotter.plot(economy_record, show_plot=False, save_plot=True, savedir=tmp_path)
    cmp = tmp_path / "cmp.png"
    with pytest.raises(KeyboardInterrupt):
        compare([economy_record, economy_record], savepath=cmp, dpi=20)
    assert final.read_bytes() == b"complete" and not cmp.exists()
    assert sorted(os.listdir(tmp_path)) == ["cockpit__primary.png"]


def test_animation_is_written_atomically(tmp_path, economy_record, monkeypatch):
    from PIL import Image

    log = records.write_jsonl(str(tmp_path / "run.jsonl"), {s: e for s, e in economy_record.items() if s < 6})
    real_save = Image.Image.save

    def save(self, fp, *args, **kwargs):
        assert not str(fp).endswith("run__primary.gif")  # never written under its final name directly
        return real_save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", save)
    path = CockpitPlotter(figsize=(6, 4), dpi=20).build_animation(log, max_frames=2)
    assert path == str(tmp_path / "run__primary.gif") and Image.open(path).n_frames == 2
