"""The panel of a custom quantity: ``Dashboard(extra=[...])`` draws any key of the record."""

import numpy as np
from conftest import FAST
from figure_text import not_tracked

from instruments import Dashboard


def _record():
    """A custom scalar with per-layer values at every second step, and a per-parameter list."""
    record = {}
    for step in range(10):
        entry = {"Loss": 1.0 / (step + 1)}
        if step % 2 == 0:
            entry["Opposing"] = 0.1 * step
            entry["layers"] = {"Opposing": [0.05 * step, 0.2 * step]}
        entry["PerParam"] = [1.0, 2.0 + step]
        record[step] = entry
    return record


def test_extra_panels_draw_the_values():
    dashboard = Dashboard(extra=["Opposing", "PerParam", "Absent"], **FAST)
    dashboard.draw(_record())
    ax = dashboard.axes["Opposing"]
    assert ax.get_title() == "Opposing 0.8 @ 8"
    total = [line for line in ax.get_lines() if line.get_label() == "total"][0]
    np.testing.assert_allclose(total.get_xdata(), [0, 2, 4, 6, 8])
    np.testing.assert_allclose(total.get_ydata(), [0.0, 0.2, 0.4, 0.6, 0.8])
    assert len(ax.get_lines()) == 3  # two layers and the total
    per_param = [line for line in dashboard.axes["PerParam"].get_lines() if line.get_label() == "total"][0]
    np.testing.assert_allclose(per_param.get_ydata(), [3.0 + s for s in range(10)])  # the sum of the list
    assert not_tracked(dashboard.axes["Absent"])


def test_no_extra_row_by_default():
    dashboard = Dashboard(**FAST)
    fig = dashboard.draw(_record())
    assert "Opposing" not in dashboard.axes
    assert fig.get_size_inches()[1] == 10
