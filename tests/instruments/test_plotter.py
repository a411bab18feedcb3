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
    plotter, path = _plot(LiveCockpit(full_record, names), tmp_path, savedir=tmp_path, savename_append="__epoch_03")
    assert path == os.path.join(tmp_path, "cockpit__epoch_03.png")
    assert os.path.exists(path)
    legend = [t.get_text() for t in plotter.fig.legends[0].get_texts()]
    assert legend[1] == names[0]


def test_record_dict_with_string_steps(tmp_path, economy_record):
    source = {str(k): v for k, v in economy_record.items()}
    plotter = CockpitPlotter(**FAST)
    assert plotter.plot(source, show_plot=False) is None
    assert any(t.startswith("α, last 10%") for t in all_titles(plotter.fig))
    assert plotter.save_path(source, savedir=tmp_path, savename="econ") == os.path.join(tmp_path, "econ.png")


def test_jsonl_path_defaults_next_to_the_log(tmp_path, full_jsonl):
    plotter, path = _plot(full_jsonl, tmp_path)
    assert path == os.path.join(tmp_path, "run.png")
    assert imread(path).shape[:2] == (400, 640)
    legend = [t.get_text() for t in plotter.fig.legends[0].get_texts()]
    assert legend[1:] == records.NAMES  # names from the log header


def test_json_path_and_path_without_extension(tmp_path, full_record):
    write_json(tmp_path / "old.json", full_record)
    plotter = CockpitPlotter(**FAST)
    plotter.plot(str(tmp_path / "old"), show_plot=False)  # Cockpit passes the log path without ".json"
    assert any(t.startswith("λmax") for t in all_titles(plotter.fig))
    assert plotter.save_path(str(tmp_path / "old")) == os.path.join(tmp_path, "old.png")
    assert plotter.save_path(str(tmp_path / "old.json"), fmt="pdf") == os.path.join(tmp_path, "old.pdf")


def test_live_cockpit_default_savedir_is_cwd(economy_record):
    assert CockpitPlotter().save_path(LiveCockpit(economy_record)) == os.path.join(".", "cockpit.png")


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
