"""The findings panel lists the record's findings; their steps are marked on the gauges they concern."""

import copy
import subprocess
import sys

import numpy as np
import pytest
from conftest import FAST, _ROOT
from figure_text import drawn_texts, not_tracked, overlapping_texts, texts
from matplotlib.text import Text

import records
from instruments import Dashboard, draw_gauge
from instruments.gauges import findings

FOUND = [
    {"kind": "lr_too_high", "layer": None, "step": 12, "severity": "error",
     "message": "the loss spiked to 68.3 at step 12, 30x its first value 2.3",
     "suggestion": "lower the learning rate (by 3-10x)", "evidence": {}},
    {"kind": "dead_relu", "layer": "encoder.3", "step": 20, "severity": "warning",
     "message": "'encoder.3' (ReLU): 94% of its units have not fired", "suggestion": "use LeakyReLU",
     "evidence": {}},
]


def test_panel_numbers_each_finding_with_kind_layer_and_step(full_record, ax):
    draw_gauge("findings", records.with_findings(full_record, FOUND), ax)
    shown = texts(ax)
    assert ax.get_title() == "Diagnosis: 2 finding(s), 1 error(s)"
    assert "1. step 12 · lr_too_high" in shown and "2. step 20 · dead_relu [encoder.3] ← 1." in shown
    assert any("30x its first value" in t for t in shown)


def test_panel_lists_the_cause_first_and_marks_its_consequences(full_record, ax):
    """As every report does (cockpit_lite.diagnosis.precedence): unnormalized_inputs, found at a later
    record than the loss spike it caused, is listed first; the spike and the dead units point to it."""
    found = [dict(FOUND[0], step=1), dict(FOUND[1], step=1),
             {"kind": "unnormalized_inputs", "layer": None, "step": 0, "severity": "warning",
              "message": "the model's inputs have mean 122", "suggestion": "standardise the inputs", "evidence": {}}]
    record = records.with_findings(full_record, found)
    draw_gauge("findings", record, ax)
    shown = texts(ax)
    assert "1. step 0 · unnormalized_inputs" in shown
    assert "2. step 1 · lr_too_high ← 1." in shown and "3. step 1 · dead_relu [encoder.3] ← 1." in shown


def test_many_findings_are_counted_not_overflowing(full_record, ax):
    many = [dict(FOUND[0], step=s) for s in range(1, 10)]
    draw_gauge("findings", records.with_findings(full_record, many), ax)
    assert any(t.startswith("+3 more") for t in texts(ax))  # 6 shown


def _panel_text(ax):
    """The findings panel's text, as one line of words (wrapped lines joined)."""
    return " ".join(" ".join(texts(ax)).split())


@pytest.mark.parametrize("where", ["a panel of its own", "the dashboard's bottom row"])
def test_every_finding_is_shown_whole_message_and_fix(where, full_record, ax):
    """Sentence-long messages and fixes wrap onto as many lines as they need (the font gets
    smaller where the panel is small); none is cut with "…"."""
    record = records.with_findings(full_record)
    if where == "a panel of its own":
        draw_gauge("findings", record, ax)
    else:
        dashboard = Dashboard(**FAST)
        dashboard.draw(record)
        ax = dashboard.axes["findings"]
    shown = _panel_text(ax)
    assert "…" not in shown
    for finding in records.LONG_FINDINGS:
        assert finding["message"] in shown and "→ " + finding["suggestion"] in shown


def test_the_findings_stay_inside_their_panel():
    """At the font the panel chose, its lines neither overlap each other nor leave the panel."""
    dashboard = Dashboard(dpi=50)
    fig = dashboard.draw(records.with_findings(records.full_record()))
    panel = dashboard.axes["findings"]
    boxes = [(text, box, artist) for text, box, artist in drawn_texts(fig) if artist.get_figure() is panel.figure]
    lines = [box for text, box, _ in boxes if text != panel.get_title()]
    assert len(lines) >= 3 * len(records.LONG_FINDINGS)  # head, message and fix of each
    assert not overlapping_texts(fig, boxes=boxes)
    edge = panel.figure.bbox
    assert all(edge.x0 - 1 <= box.x0 and box.x1 <= edge.x1 + 1 and edge.y0 - 1 <= box.y0 for box in lines)


def test_a_large_panel_gets_a_larger_font(full_record):
    from matplotlib.figure import Figure

    sizes = []
    for inches in ((4, 3), (10, 8)):
        ax = Figure(figsize=inches, dpi=40, layout="constrained").add_subplot()
        draw_gauge("findings", records.with_findings(full_record), ax)
        sizes.append(max(text.get_fontsize() for text in ax.artists[0].findobj(Text)))
    assert sizes[0] < sizes[1]


def test_panel_without_findings(full_record, economy_record, ax):
    draw_gauge("findings", economy_record, ax)  # a run with diagnose=False: no signals, no findings
    assert "diagnose=False" in "\n".join(texts(ax)) and not not_tracked(ax)
    diagnosed = copy.deepcopy(economy_record)
    diagnosed[0]["NonfiniteOrigin"] = {"module": None}
    ax.clear()
    draw_gauge("findings", diagnosed, ax)
    assert "no problem found" in texts(ax)


def test_dashboard_marks_the_steps_on_the_concerned_gauges(full_record):
    dashboard = Dashboard(**FAST)
    record = records.with_findings(full_record, FOUND)
    dashboard.draw(record)
    assert "findings" in dashboard.axes

    def marked_steps(name):
        ax = dashboard.axes[name]
        return sorted(float(np.asarray(line.get_xdata())[0]) for line in ax.lines if line.get_gid() == findings.MARK)

    assert marked_steps("performance") == [12.0, 20.0]  # both kinds concern the loss
    assert marked_steps("grad_norm") == [12.0]  # lr_too_high only
    assert marked_steps("max_ev") == []
    numbers = [t.get_text().strip() for t in dashboard.axes["performance"].texts]
    assert "1" in numbers and "2" in numbers


def test_marks_skip_untracked_gauges(economy_record):
    dashboard = Dashboard(**FAST)
    record = records.with_findings(economy_record, [dict(FOUND[0], kind="edge_of_stability")])
    dashboard.draw(record)
    assert "max_ev" not in dashboard.axes  # an untracked gauge has no panel to mark


def test_every_kind_concerns_time_axis_gauges():
    from instruments.gauges import GAUGES

    kinds = ("lr_too_high", "lr_too_low", "exploding_gradients", "vanishing_gradients", "dead_relu",
             "saturated_activations", "unnormalized_inputs", "missing_zero_grad", "shuffled_labels", "nan_loss",
             "noise_dominates", "edge_of_stability", "overfitting")
    assert set(findings.CONCERNS) == set(kinds)
    assert all(name in GAUGES for names in findings.CONCERNS.values() for name in names)


def test_findings_panel_never_imports_torch(full_record):
    code = (
        "import sys, instruments; from instruments.gauges import findings;"
        "import matplotlib.figure as f; ax = f.Figure().add_subplot();"
        "findings.gauge({1: {'Loss': 1.0, 'findings': [{'kind': 'nan_loss', 'layer': 'loss_fn', 'step': 1,"
        "'severity': 'error', 'message': 'm', 'suggestion': 's'}]}}, ax);"
        "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_ROOT)
