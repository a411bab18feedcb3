"""The dashboard lays out the gauges of what a record holds, in groups, and writes a readable PNG:
no empty or "not tracked" panel, no text over other text, for every kind of record."""

import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
from conftest import FAST, _ROOT
from figure_text import all_titles, drawn_texts, empty_axes, not_tracked, outside_parent, overlapping_texts, texts
from matplotlib.collections import PolyCollection
from matplotlib.image import imread

from instruments import BOTTOM, GAUGES, LAYOUT, Dashboard, Run, plan, render
from instruments import gauges as gauges_module
from instruments.gauges import gradient_tests

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


DIAGNOSIS_GAUGES = {"findings", "dead_units", "saturation", "grad_ratio", "update_ratio"}
ECONOMY_GAUGES = {"alpha", "distance", "grad_norm", "gradient_tests", "histogram_1d", "mean_gsnr", "grad_variance",
                  "performance"}


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
    assert set(dashboard.axes) == set(GAUGES) - DIAGNOSIS_GAUGES  # no diagnosis signals in this record
    assert not any(not_tracked(ax) for ax in dashboard.axes.values())
    assert _groups(dashboard.figure) == [g for g, _ in LAYOUT] + [g for g, *_ in BOTTOM if g != "DIAGNOSIS"]
    assert dashboard.figure._suptitle.get_text().startswith("cockpit-lite · full")
    legend_labels = [t.get_text() for t in dashboard.figure.legends[0].get_texts()]
    assert legend_labels == ["total"] + names


def test_economy_dashboard_draws_only_what_it_tracks(economy_record):
    dashboard = Dashboard(**FAST)
    dashboard.draw(economy_record)
    assert set(dashboard.axes) == ECONOMY_GAUGES
    assert not any(not_tracked(ax) for ax in dashboard.axes.values())
    assert _groups(dashboard.figure) == ["STEP SIZE", "GRADIENTS", "GRADIENT NOISE", "PERFORMANCE"]
    # without names from a header the layers are numbered
    legend_labels = [t.get_text() for t in dashboard.figure.legends[0].get_texts()]
    assert legend_labels[1] == "param_0"


def test_a_diagnosis_only_run_gets_gauges_of_its_own_signals():
    record = records.diagnosis_record()
    layout = plan(record)
    assert layout["diagnosis_only"] and not layout["upper"]
    assert layout["health"] == ["dead_units", "saturation", "grad_ratio", "update_ratio"]
    dashboard = Dashboard(**FAST)
    dashboard.draw(Run(record, [p["name"] for p in records.diagnosis_params()]))
    assert set(dashboard.axes) == {"performance", "grad_norm", "findings", *layout["health"]}
    assert _groups(dashboard.figure) == ["PERFORMANCE", "DIAGNOSIS"]
    assert [sub._suptitle.get_text() for sub in dashboard.figure.subfigs[1:2]] == ["LAYER HEALTH"]
    # the findings are numbered on the heat maps that show them: lr_too_high (1), dead_relu (2), saturation (3)
    marked = {name: [t.get_text().strip() for t in dashboard.axes[name].texts] for name in layout["health"]}
    assert "1" in marked["update_ratio"] and "2" in marked["dead_units"] and "3" in marked["saturation"]
    # the ReLU rows of the dead-unit map, the tanh row of the saturation map
    assert [t.get_text() for t in dashboard.axes["dead_units"].get_yticklabels()] == [
        "features.1 (ReLU)", "features.3 (ReLU)", "features.5 (ReLU)"]
    assert [t.get_text() for t in dashboard.axes["saturation"].get_yticklabels()] == ["head.0 (Tanh)"]


def test_a_healthy_diagnosis_run_says_so_and_leaves_out_saturation_without_tanh():
    record = records.diagnosis_record(60, n_tanh=0, broken=False)
    dashboard = Dashboard(**FAST)
    dashboard.draw(record)
    assert "saturation" not in dashboard.axes and "dead_units" in dashboard.axes
    assert "no problem found" in texts(dashboard.axes["findings"])


def test_many_layers_and_steps_stay_readable():
    from instruments.gauges import _common, _heatmap

    wide = records.diagnosis_record(300, n_params=100, n_relu=50, n_tanh=0)
    dashboard = Dashboard(**FAST)
    dashboard.draw(Run(wide, [p["name"] for p in records.diagnosis_params(100)]))
    for name in ("dead_units", "grad_ratio", "update_ratio"):
        assert len(dashboard.axes[name].get_yticklabels()) <= _heatmap.MAX_LABELS
    assert len(dashboard.axes["grad_norm"].lines) <= _common.TOP_K + 4  # total, markers, not 100 layers
    assert any("largest of 100 layers" in t for t in texts(dashboard.axes["grad_norm"]))

    long = records.diagnosis_record(10_000, every=1)
    dashboard.draw(long)
    mesh = dashboard.axes["grad_ratio"].collections[0]
    assert mesh.get_array().shape[-1] <= _heatmap.MAX_COLUMNS
    assert dashboard.axes["grad_ratio"].get_xlim()[1] >= 9999


KINDS = {
    "diagnosis only, healthy": lambda: records.diagnosis_record(60, broken=False),
    "diagnosis only, broken": lambda: records.diagnosis_record(),
    "10,000 steps": lambda: records.diagnosis_record(10_000, every=1),
    "100 layers": lambda: records.diagnosis_record(300, n_params=100, n_relu=50, n_tanh=0),
    "economy": records.economy_record,
    "economy with diagnosis": records.economy_with_diagnosis,
    "economy estimated from a subsample (samples=8)": records.subsampled_economy_record,
    "full": records.full_record,
    "full, TICs NaN with a long flag at every step": records.full_record_without_tic,
    "full, with sentence-long findings": lambda: records.with_findings(records.full_record()),
    "one epoch (each epoch value a single point)": records.one_epoch_record,
    "only a loss": lambda: {0: {"Loss": 1.0}, 1: {"Loss": 0.5}},
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_record_kind_renders_without_empty_panels_or_overlapping_text(kind):
    dashboard = Dashboard(dpi=50)
    fig = dashboard.draw(KINDS[kind]())
    assert not [name for name, ax in dashboard.axes.items() if not_tracked(ax)]
    assert not empty_axes(fig)
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):  # as the CLI and the render worker draw
        boxes = drawn_texts(fig)
    assert len(boxes) > 5
    assert not [text for text, *_ in boxes if "$" in text or "mathdefault" in text]
    assert not overlapping_texts(fig, boxes=boxes)
    assert not outside_parent(fig, boxes=boxes)


def test_estimates_from_a_subsample_are_shaded_and_titled():
    """The band is the 95 % t-interval of the recorded degrees of freedom on the log scale,
    value · exp(±t₇(0.975) · se/value), and its legend says so."""
    record = records.subsampled_economy_record()
    dashboard = Dashboard(**FAST)
    dashboard.draw(record)
    for name in ("gradient_tests", "grad_variance", "histogram_1d"):
        assert "est. 8/64 samples" in dashboard.axes[name].get_title(), name
    label = "95 % interval (t, 7 df, log scale)"
    bands = [c for c in dashboard.axes["gradient_tests"].collections if c.get_label() == label]
    assert len(bands) == 1
    band = next(c for c in dashboard.axes["grad_variance"].collections if c.get_label() == label)
    step = sorted(s for s in record if "GradVariance" in record[s])[1]
    value = sum(record[step]["GradVariance"])
    factor = math.exp(scipy.stats.t.ppf(0.975, 7) * 0.1)  # se = 10 % of the value
    vertices = band.get_paths()[0].vertices
    at_step = vertices[np.isclose(vertices[:, 0], step)][:, 1]
    assert sorted(at_step) == pytest.approx([value / factor, value * factor], rel=1e-9)


def test_a_recorded_interval_is_shaded_and_a_record_without_df_takes_the_normal_quantile():
    record = records.subsampled_economy_record()
    steps = sorted(s for s in record if "NormTest" in record[s])
    for step in steps:
        meta = record[step]["meta"]["NormTest"]
        del meta["df"], meta["scale"]
        value = record[step]["InnerTest"]
        record[step]["meta"]["InnerTest"] = {"samples": 8, "of": 64, "se": 1e9, "df": 7, "coverage": 0.95,
                                             "interval": [0.5 * value, 2 * value]}
    dashboard = Dashboard(**FAST)
    dashboard.draw(record)
    ax = dashboard.axes["gradient_tests"]
    assert [c.get_label() for c in ax.collections if "interval" in c.get_label()] == ["95 % interval (normal)"]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]  # one per test, in KEYS' order
    assert len(bands) == 3
    vertices = bands[list(gradient_tests.KEYS).index("InnerTest")].get_paths()[0].vertices
    at_step = vertices[np.isclose(vertices[:, 0], steps[1])][:, 1]
    value = record[steps[1]]["InnerTest"]
    assert sorted(at_step) == pytest.approx([0.5 * value, 2 * value], rel=1e-9)


def test_estimated_tics_say_so_once_before_their_values():
    """Both TICs estimated from a subsample: one "est." ahead of the values (a narrow panel cuts a
    title's end first, which once dropped the trace's value along with its own "est."), a band each."""
    record = records.full_record()
    for entry in record.values():
        for name in ("TICDiag", "TICTrace"):
            if name in entry:
                entry.setdefault("meta", {})[name] = {"samples": 8, "of": 64, "se": 0.1 * abs(entry[name]),
                                                      "curvature": "diag_h"}
    dashboard = Dashboard(**FAST)
    dashboard.draw(record)
    title = dashboard.axes["tic"].get_title()
    assert title.startswith("TIC est. 8/64 samples diag ") and title.count("est.") == 1, title
    assert len([c for c in dashboard.axes["tic"].collections if c.get_label() == "95 % interval (normal)"]) == 2


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
        # the record format, the estimates' intervals, the diagnosis's pure ordering of the findings and the
        # families of the recorded activation classes' names (no torch, no model)
        "bad += [m for m in sys.modules if m.startswith('cockpit_lite.')"
        " and m not in ('cockpit_lite.intervals', 'cockpit_lite.utils', 'cockpit_lite.utils.activations')"
        " and not m.startswith(('cockpit_lite.log', 'cockpit_lite.diagnosis'))];"
        "bad += [m for m in sys.modules if m == 'matplotlib.pyplot'];"  # no global pyplot state
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_ROOT)


def test_draw_into_a_given_figure(economy_record):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 10))  # no layout engine: the dashboard sets constrained layout
    assert Dashboard().draw(economy_record, fig=fig) is fig
    assert fig.get_layout_engine() is not None


def test_the_title_says_what_an_overhead_budget_bought(economy_record):
    """From the record only: the tiers of the last plan, and the steps any of a tier's quantities
    was recorded at."""
    from instruments import data

    record = {step: dict(entry) for step, entry in economy_record.items()}
    steps = sorted(record)
    plan = {"factor": 1.25, "average": 1.2, "tiers": {"Loss": 0, "GradNorm": 0, "NormTest": 1, "HessMaxEV": 2}}
    record[steps[0]]["budget"] = {**plan, "tiers": {"Loss": 0}}  # (an earlier plan: the last one counts)
    record[steps[-1]]["budget"] = plan
    bought = data.budget_bought(record)
    loss = [s for s in steps if "Loss" in record[s] or "GradNorm" in record[s]]
    assert bought["factor"] == 1.25 and bought["tiers"]["bookkeeping"] == {
        "quantities": ["GradNorm", "Loss"], "steps": len(loss), "last": loss[-1]}
    assert bought["tiers"]["curvature"]["steps"] == 0 and data.budget_bought(economy_record) is None
    dashboard = Dashboard(**FAST)
    dashboard.draw(record)
    title = dashboard.figure._suptitle.get_text()
    assert f"budget 1.25×: bookkeeping {len(loss)} steps, per-sample " in title and "curvature 0 steps" in title
