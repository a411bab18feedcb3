"""The findings panel lists the record's findings; their steps are marked on the gauges they concern."""

import copy
import subprocess
import sys

import numpy as np
from conftest import FAST, _ROOT
from figure_text import not_tracked, texts

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


def _with_findings(record, found=FOUND):
    record = copy.deepcopy(record)
    for finding in found:
        record[finding["step"]].setdefault("findings", []).append(finding)
    return record


def test_panel_numbers_each_finding_with_kind_layer_and_step(full_record, ax):
    draw_gauge("findings", _with_findings(full_record), ax)
    shown = texts(ax)
    assert ax.get_title() == "Diagnosis: 2 finding(s), 1 error(s)"
    assert "1. step 12 · lr_too_high" in shown and "2. step 20 · dead_relu [encoder.3]" in shown
    assert any("30x its first value" in t for t in shown)


def test_many_findings_are_counted_not_overflowing(full_record, ax):
    many = [dict(FOUND[0], step=s) for s in range(1, 10)]
    draw_gauge("findings", _with_findings(full_record, many), ax)
    assert any(t.startswith("+3 more") for t in texts(ax))  # 6 shown


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
    record = _with_findings(full_record)
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
    record = _with_findings(economy_record, [dict(FOUND[0], kind="edge_of_stability")])
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
