"""Every gauge draws from every record; missing quantities say so; titles carry the numbers."""

import math

import numpy as np
import pytest
from figure_text import drawn_texts, not_tracked, overlapping_texts, texts
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import records
from instruments import GAUGES, Dashboard, draw_gauge
from instruments import data, style

ECONOMY_MISSING = ("max_ev", "hess_trace", "tic", "histogram_2d", "cabs", "early_stopping", "hyperparameters")


@pytest.mark.parametrize("name", list(GAUGES))
def test_every_gauge_draws(name, any_record, ax, names):
    GAUGES[name].draw(any_record, ax, params=names)
    assert ax.get_title(), f"{name} left its title empty"
    ax.figure.canvas.draw()  # layout and render must not fail either


@pytest.mark.parametrize("name", list(GAUGES))
def test_every_gauge_says_not_tracked_on_an_empty_record(name, ax):
    draw_gauge(name, {0: {"Time": 1.0}, 1: {"Time": 2.0}}, ax)
    assert not_tracked(ax)
    assert ax.get_title()


@pytest.mark.parametrize("name", ECONOMY_MISSING)
def test_economy_record_marks_untracked_gauges(name, economy_record, ax):
    GAUGES[name].draw(economy_record, ax)
    shown = "\n".join(texts(ax))
    assert "not tracked" in shown
    for key in GAUGES[name].keys[:1]:
        assert key in shown  # names the missing quantity


def test_not_tracked_hint_names_configuration(economy_record, ax):
    draw_gauge("max_ev", economy_record, ax)
    assert "configuration('full')" in "\n".join(texts(ax))


@pytest.mark.parametrize("name", ["alpha", "grad_norm", "distance", "gradient_tests", "histogram_1d", "performance",
                                  "mean_gsnr", "grad_variance"])
def test_economy_gauges_are_drawn(name, economy_record, ax):
    draw_gauge(name, economy_record, ax)
    assert not not_tracked(ax)


def test_all_nan_quantity_is_reported(ax):
    record = {s: {"GradNorm": [math.nan, math.nan]} for s in range(5)}
    draw_gauge("grad_norm", record, ax)
    assert any("no finite value" in t for t in texts(ax))


def test_an_all_nan_quantity_says_why_from_its_flag(ax):
    """The newest flag naming the quantity gives the reason (its first sentence), e.g. a TIC
    without an exact curvature diagonal."""
    reason = "TICDiag: not computed: the model (Net) is not BackPACK-extended"
    record = {s: {"TICDiag": math.nan, "TICTrace": math.nan,
                  "flags": ["other: unrelated.", f"{reason}. Fix: wrap the model in cockpit_lite.extend(...)"]}
              for s in range(3)}
    draw_gauge("tic", record, ax)
    shown = " ".join(" ".join(texts(ax)).split())
    assert "no finite value" in shown and reason + "." in shown and "Fix:" not in shown and "unrelated" not in shown


def test_alpha_title_and_outliers(full_record, ax):
    draw_gauge("alpha", full_record, ax)
    xs, alpha = data.finite(*data.series(full_record, "Alpha"))
    recent = alpha[-math.ceil(len(alpha) * 0.1):]
    assert ax.get_title() == f"α, last 10%: median {np.median(recent):.2f}"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "1 > 2.5, in the edge bins" in legend  # the 4.2 outlier beyond the clip range


def test_alpha_has_one_y_axis_and_no_stray_marks(full_record, ax):
    """The parabola is a sketch on the histogram's axis (once a second y axis of its own), and the
    count of outliers is in the legend (once a red "1 ▶" alone at the panel's edge)."""
    draw_gauge("alpha", full_record, ax)
    assert ax.figure.get_axes() == [ax]
    assert ax.get_ylabel() == "fraction of steps"
    assert not ax.texts
    assert [t.get_text() for t in ax.get_legend().get_texts()][:3] == [
        "all (n=59)", "last 10% (n=6)", "loss along the step (sketch)"]


def test_alpha_counts_concave_fits(ax):
    record = {s: {"Alpha": -1.0 if s % 2 else 0.1} for s in range(40)}
    draw_gauge("alpha", record, ax)
    assert "50% at −1" in ax.get_title()


def test_grad_norm_title_has_total_and_largest_layer(full_record, ax, names):
    draw_gauge("grad_norm", full_record, ax, params=names)
    last = full_record[max(full_record)]["GradNorm"]
    assert style.fmt(math.sqrt(sum(v * v for v in last))) in ax.get_title()
    assert names[int(np.argmax(last))] in ax.get_title()
    # one thin line per layer plus the bold total
    assert len(ax.lines) == records.N_LAYERS + 1


def test_per_layer_options(full_record, names):
    fig = Figure(figsize=(8, 6), dpi=40, layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    draw_gauge("histogram_1d", full_record, axes[0], layers=True, params=names)
    assert len(axes[0].patches) > 0 and "fc.weight" in [t.get_text() for t in axes[0].get_legend().get_texts()]
    draw_gauge("histogram_1d", full_record, axes[1], layer=4, params=names)
    assert "fc.weight" in axes[1].get_title()
    draw_gauge("histogram_2d", full_record, axes[2], layer=1, params=names)
    assert "conv1.bias" in axes[2].get_title()
    draw_gauge("histogram_2d", full_record, axes[3], marginals=False, zoom=False)
    assert axes[3].get_xlim() == (-2.0, 2.0)
    draw_gauge("gradient_tests", full_record, axes[4], layers="NormTest")
    draw_gauge("tic", full_record, axes[5], layers=True)
    fig.canvas.draw()


def test_histogram_2d_has_marginals(full_record, ax):
    draw_gauge("histogram_2d", full_record, ax)
    assert len(ax.child_axes) == 3
    assert "@ 50" in ax.get_title()  # last step holding the 2-d histogram


def test_performance_marks_flagged_steps(full_record, ax):
    draw_gauge("performance", full_record, ax)
    assert f"@ {records.NAN_STEP}" in ax.get_title()
    assert "non-finite loss" in ax.get_title()
    ticks = [c for c in ax.collections if c.get_label() == "non-finite loss"]
    assert len(ticks) == 1
    assert [segment[0][0] for segment in ticks[0].get_segments()] == [records.NAN_STEP]


def test_a_sentence_long_flag_is_named_by_its_quantity(ax):
    """In the title and the legend: the part before the first colon, not the sentence."""
    draw_gauge("performance", records.full_record_without_tic(), ax)
    assert "TICDiag, TICTrace, non-finite loss @ 0" in ax.get_title() and "not computed" not in ax.get_title()
    assert [c.get_label() for c in ax.collections if c.get_label().startswith("TIC")] == [
        "TICDiag, TICTrace, non-finite loss"]


def test_max_ev_draws_stability_limit(full_record, ax):
    draw_gauge("max_ev", full_record, ax)
    assert "2/η 200" in ax.get_title()  # last learning rate 0.01
    assert "2/η" in [line.get_label() for line in ax.lines]


def test_max_ev_far_below_stability_limit(ax):
    record = {s: {"HessMaxEV": 1.0 + 0.01 * s, "learning_rate": 0.1} for s in range(10)}
    draw_gauge("max_ev", record, ax)
    assert "2/η" not in [line.get_label() for line in ax.lines]  # 20 ≫ 1.1 would squash the curve
    assert any("off scale" in t.get_text() for t in ax.texts)
    assert ax.get_ylim()[1] < 5


def test_auto_log_scale():
    fig = Figure()
    ax = fig.add_subplot()
    assert style.auto_yscale(ax, np.array([1e-3, 1.0])) == "log"
    assert style.auto_yscale(ax, np.array([1.0, 2.0])) == "linear"
    assert style.auto_yscale(ax, np.array([-1e-4, 10.0, 1e3, -5e2, 3e-4, 2.0])) == "symlog"


def test_symlog_tick_labels_are_plain_numbers():
    """A symlog axis (Hutchinson's per-layer traces of both signs) drawn where text is literal (every
    dashboard): matplotlib's own labels are mathtext, which came out raw ("$\\mathdefault{10^{0}}$")."""
    fig = Figure()
    ax = fig.add_subplot()
    values = np.array([-1e-3, 0.5, 2.0, -0.02, 3e-4, 1.5])
    ax.plot(values)
    assert style.auto_yscale(ax, values) == "symlog"
    with data.literal_text():
        fig.canvas = FigureCanvasAgg(fig)
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and not any("$" in label or "mathdefault" in label for label in labels), labels
    assert all(float(label) == float(label) for label in labels)  # plain numbers: "-0.1", "1", "1e-3"


def test_smooth_has_no_lag():
    ramp = np.arange(100.0)
    smoothed = data.smooth(ramp)
    assert abs(smoothed[50] - 50) < 1e-9 and smoothed[-1] == 99  # centred: no lag
    assert np.isnan(data.smooth([np.nan, np.nan])).all()


def test_smooth_is_local():
    values = np.r_[np.ones(200), np.exp(np.arange(1, 30))]  # a run that explodes at the end
    smoothed = data.smooth(values)
    assert np.allclose(smoothed[:150], 1.0)  # the explosion does not bend the early curve


def test_heat_maps_draw_black_only_for_zero(ax):
    """A log heat map's colour range is robust (percentiles), but values beyond it take its end
    colours: only a ratio of exactly 0 (no gradient, no update) is drawn in the black "under" colour."""
    record = records.diagnosis_record(120, broken=False)
    record[50]["GradNorm"] = [1e-9] + record[50]["GradNorm"][1:]  # far below the rest, not zero
    record[60]["GradNorm"] = [0.0] + record[60]["GradNorm"][1:]
    draw_gauge("grad_ratio", record, ax)
    mesh = ax.collections[0]
    values = np.ma.filled(mesh.get_array(), np.nan).reshape(len(ax.get_yticklabels()), -1)
    below = np.argwhere(values < mesh.norm.vmin)
    assert below.tolist() == [[0, list(sorted(s for s in record if "ParamNorm" in record[s])).index(60)]]


@pytest.mark.parametrize("name", ["grad_ratio", "update_ratio"])
def test_a_zero_initialised_tensor_has_no_ratio_and_the_map_still_draws(name, ax):
    """‖θ‖ = 0 (a bias or class token initialised at 0): its ratio is undefined, a grey (NaN) cell,
    and the other rows are drawn (the division once raised and the whole gauge failed)."""
    record = records.diagnosis_record(40, broken=False)
    first = min(s for s in record if "ParamNorm" in record[s])
    record[first]["ParamNorm"] = [0.0] + record[first]["ParamNorm"][1:]
    draw_gauge(name, record, ax)
    mesh = ax.collections[0]
    values = np.ma.filled(mesh.get_array(), np.nan).reshape(len(ax.get_yticklabels()), -1)
    assert np.isnan(values[0, 0]) and np.isfinite(values[1:, 0]).all()


def test_layer_health_gauges_read_the_diagnosis_signals(ax):
    record = records.diagnosis_record()
    for name in ("dead_units", "saturation", "grad_ratio", "update_ratio"):
        assert GAUGES[name].has_data(record), name
        assert not GAUGES[name].has_data(records.economy_record()), name
    draw_gauge("dead_units", record, ax)
    assert ax.get_title().startswith("Dead units · worst 100.0% in features.5")


def _colour_bar(ax):
    """The colour bar drawn next to the heat map ``ax``."""
    (bar,) = [other for other in ax.figure.get_axes() if other.get_label() == "<colorbar>"]
    return bar


@pytest.mark.parametrize("name, zero", [("grad_ratio", "black: no gradient"), ("update_ratio", "black: did not move")])
def test_the_colour_bar_says_what_black_and_grey_cells_mean(name, zero, ax):
    """Black (a ratio of exactly 0) and grey (no value) are outside the colour scale: the colour
    bar's label names them where the map has them, and only there."""
    healthy = records.diagnosis_record(40, broken=False)
    draw_gauge(name, healthy, ax)
    assert "black" not in _colour_bar(ax).get_ylabel() and "grey" not in _colour_bar(ax).get_ylabel()

    broken = records.diagnosis_record(60)  # half of the tensors get no gradient after the blown-up step
    first = min(s for s in broken if "ParamNorm" in broken[s])
    broken[first]["ParamNorm"] = [0.0] + broken[first]["ParamNorm"][1:]  # no ratio: a grey cell
    ax.figure.clear()
    ax = ax.figure.add_subplot()
    draw_gauge(name, broken, ax)
    label = _colour_bar(ax).get_ylabel()
    assert zero in label and "grey: no value" in label


def test_dead_unit_maps_name_their_threshold_not_black():
    ax = Figure(figsize=(4, 3), dpi=40, layout="constrained").add_subplot()
    draw_gauge("dead_units", records.diagnosis_record(), ax)
    assert _colour_bar(ax).get_ylabel() == "dead fraction\nred: rule, 50%"


def test_colour_bar_labels_and_ticks_have_one_size():
    """Major and minor tick labels (a log bar over less than ~2 decades labels its minor ticks)
    and the bar's label: one size in every heat map of the dashboard."""
    record = records.diagnosis_record(60, broken=False)
    for step, entry in record.items():  # ratios over less than 2 decades
        entry["GradNorm"] = [norm * (0.05 + 0.01 * (i + step % 7)) for i, norm in enumerate(entry["ParamNorm"])]
        entry["UpdateSize"] = [0.1 * grad for grad in entry["GradNorm"]]
    dashboard = Dashboard(dpi=40)
    fig = dashboard.draw(record)
    fig.canvas.draw()
    bars = [ax for ax in fig.get_axes() if ax.get_label() == "<colorbar>"]
    assert len(bars) == 4  # dead units, saturation, ‖g‖/‖θ‖, ‖Δθ‖/‖θ‖
    sizes = set()
    for bar in bars:
        labels = [t for t in bar.get_yticklabels(which="both") if t.get_text()]
        assert labels
        sizes |= {t.get_fontsize() for t in labels} | {bar.yaxis.label.get_fontsize()}
    assert any(len([t for t in bar.get_yticklabels(minor=True) if t.get_text()]) for bar in bars)
    assert len(sizes) == 1, sizes


def test_a_series_of_one_point_reads_as_a_value():
    """After one epoch each epoch value (losses, accuracies, the learning rate) is one point at the
    last step: a large marker with its value written beside it, not a lost dot on the panel's edge."""
    record = records.one_epoch_record()
    fig = Figure(figsize=(10, 3), dpi=40, layout="constrained")
    performance, lr = fig.subplots(1, 2, width_ratios=[3, 1])
    draw_gauge("performance", record, performance)
    draw_gauge("hyperparameters", record, lr)

    def lone_markers(ax):
        twins = [a for a in ax.figure.get_axes() if a.bbox.bounds == ax.bbox.bounds]  # ax and its twin
        return [line for a in twins for line in a.lines
                if len(line.get_xdata()) == 1 and line.get_marker() not in (None, "None", "none")
                and line.get_markersize() >= 6]  # twice a series' markers

    assert len(lone_markers(performance)) == 4 and len(lone_markers(lr)) == 1
    assert {"1.16", "1.12", "73.4%", "75.3%"} <= {t.get_text() for t in performance.texts}
    assert "0.2" in [t.get_text() for t in lr.texts]
    assert not overlapping_texts(fig, boxes=drawn_texts(fig))
