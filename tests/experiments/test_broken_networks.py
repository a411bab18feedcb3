"""``python -m experiments.broken_networks`` end to end on two short runs: findings printed, one dashboard
with the findings panel per run, the confusion table."""

import logging

from matplotlib.image import imread

from experiments import broken_networks


def test_main_writes_a_dashboard_per_run(tmp_path, capsys):
    level = logging.getLogger("cockpit_lite.diagnosis").level
    try:
        rows = broken_networks.main(["--only", "dead_relu_bias", "healthy_regression", "--steps", "12",
                                     "--out", str(tmp_path)])
    finally:
        logging.getLogger("cockpit_lite.diagnosis").setLevel(level)
    printed = capsys.readouterr().out
    assert [(name, passed) for name, _, passed, _, _ in rows] == [("dead_relu_bias", True),
                                                                  ("healthy_regression", True)]
    assert "dead_relu [4]: '4' (ReLU)" in printed and "no findings" in printed
    assert "scenario | expected | first detection" in printed
    for name in ("dead_relu_bias", "healthy_regression"):
        assert imread(tmp_path / f"{name}.png").shape[:2] == (1000, 1600)
        assert (tmp_path / f"{name}.jsonl").exists()
