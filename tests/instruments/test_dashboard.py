"""The dashboard lays out every gauge in its group and writes a readable PNG."""

import subprocess
import sys

import pytest
from conftest import FAST, _ROOT
from figure_text import all_titles, not_tracked
from matplotlib.image import imread

from instruments import BOTTOM, GAUGES, LAYOUT, Dashboard, Run, render
from instruments import gauges as gauges_module

import records

EXPECTED_FULL = [
    "α, last 10%: median",
    "Distance ",
    "‖g‖ ",
    "tests: norm",
    "grad elements @ 55",
    "grad × param @ 50",
    "mean GSNR",
    "tr Σ",
    "CABS batch size",
    "λmax",
    "tr H",
    "TIC diag",
    "learning rate 0.01",
    "loss ",
    "EB criterion",
]


def _groups(fig):
    return [sub._suptitle.get_text() for sub in fig.subfigs[0].subfigs + fig.subfigs[1].subfigs]


def test_full_dashboard_png(tmp_path, full_record, names):
    path = tmp_path / "dash.png"
    dashboard = Dashboard()
    written = dashboard.save(Run(full_record, names, "full"), path)
    assert written == str(path)
    image = imread(path)
    assert image.shape[:2] == (1000, 1600)  # 16 x 10 inches at 100 dpi
    titles = all_titles(dashboard.figure)
    for expected in EXPECTED_FULL:
        assert any(t.startswith(expected) for t in titles), (expected, titles)
    assert set(dashboard.axes) == set(GAUGES)
    assert not any(not_tracked(ax) for ax in dashboard.axes.values())
    assert _groups(dashboard.figure) == [g for g, _ in LAYOUT] + [g for g, *_ in BOTTOM]
    assert dashboard.figure._suptitle.get_text().startswith("cockpit-lite · full")
    legend_labels = [t.get_text() for t in dashboard.figure.legends[0].get_texts()]
    assert legend_labels == ["total"] + names


def test_economy_dashboard_shows_untracked_panels(economy_record):
    dashboard = Dashboard(**FAST)
    dashboard.draw(economy_record)
    untracked = {name for name, ax in dashboard.axes.items() if not_tracked(ax)}
    assert untracked == {"max_ev", "hess_trace", "tic", "histogram_2d", "cabs", "early_stopping", "hyperparameters"}
    # without names from a header the layers are numbered
    legend_labels = [t.get_text() for t in dashboard.figure.legends[0].get_texts()]
    assert legend_labels[1] == "param_0"


def test_step_axes_are_aligned(full_record):
    dashboard = Dashboard(**FAST)
    dashboard.draw(full_record)
    limits = {name: dashboard.axes[name].get_xlim() for name in ("grad_norm", "max_ev", "hess_trace", "performance")}
    assert len(set(limits.values())) == 1, limits


def test_layerwise_row(full_record, names):
    dashboard = Dashboard(layerwise=True, **FAST)
    dashboard.draw(Run(full_record, names))
    per_layer = dashboard.axes["layerwise"]
    assert len(per_layer) == records.N_LAYERS
    assert [name in ax.get_title() for ax, name in zip(per_layer, names)] == [True] * records.N_LAYERS
    assert dashboard.figure.get_size_inches()[1] == pytest.approx(13.2)


def test_layerwise_without_histograms(economy_record):
    dashboard = Dashboard(layerwise=True, **FAST)
    dashboard.draw(economy_record)
    assert not_tracked(dashboard.axes["layerwise"][0])


def test_failing_gauge_is_contained(monkeypatch, full_record):
    def broken(record, ax, **options):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(gauges_module.GAUGES, "cabs", gauges_module.Gauge("cabs", broken, "CABS", ("CABS",), ""))
    dashboard = Dashboard(**FAST)
    with pytest.warns(RuntimeWarning, match="cabs"):
        dashboard.draw(full_record)
    assert any("could not draw" in t.get_text() for t in dashboard.axes["cabs"].texts)
    with pytest.raises(ZeroDivisionError):
        Dashboard(strict=True, **FAST).draw(full_record)


def test_render_helper(tmp_path, full_jsonl):
    out = render(full_jsonl, tmp_path / "sub" / "r.png", **FAST)
    assert imread(out).shape[:2] == (400, 640)


def test_instruments_never_imports_torch():
    code = (
        "import sys, instruments, instruments.cli, instruments.epoch, instruments._worker;"
        "instruments.Dashboard().draw({0: {'Loss': 1.0}, 1: {'Loss': 0.5}});"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')];"
        "bad += [m for m in sys.modules if m.startswith('cockpit_lite.') and m != 'cockpit_lite.log'];"
        "bad += [m for m in sys.modules if m == 'matplotlib.pyplot'];"  # no global pyplot state
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_ROOT)


def test_draw_into_a_given_figure(economy_record):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 10))  # no layout engine: the dashboard sets constrained layout
    assert Dashboard().draw(economy_record, fig=fig) is fig
    assert fig.get_layout_engine() is not None
