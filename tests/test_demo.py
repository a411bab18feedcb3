"""The main job: the digits demo (``cockpit_lite.demo``), end to end in a tiny configuration."""

import json
import os
import subprocess
import sys

import pytest

from cockpit_lite import demo
from foreign_warnings import raised_as_errors


def test_demo_writes_log_record_and_one_dashboard_per_epoch(tmp_path, capsys):
    with raised_as_errors():
        demo.main(["--epochs", "2", "--model", "mlp", "--batch-size", "128", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and "median α" in printed
    assert sorted(p.name for p in tmp_path.glob("dashboard__epoch_*.png")) == [
        "dashboard__epoch_000.png",
        "dashboard__epoch_001.png",
    ]
    record = json.loads((tmp_path / "run.json").read_text())
    last = record[max(record, key=int)]
    assert {"Alpha", "HessMaxEV", "GradHist2d", "CABS", "EarlyStopping"} <= set(record["0"])
    # 215 of the 360 test digits (seeded; a few samples of slack for other thread counts' rounding)
    assert last["test_accuracy"] == pytest.approx(215 / 360, abs=3 / 360)
    assert (tmp_path / "run.jsonl").read_text().count("\n") > len(record)


def test_demo_runs_outside_a_clone(tmp_path):
    """``python -m cockpit_lite.demo`` needs the installed package only (no ``experiments``)."""
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "cockpit_lite.demo", "--epochs", "1", "--model", "mlp", "--batch-size", "256",
         "--level", "economy", "--no-plots", "--out", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "trained 1 epoch in" in done.stdout and "Warning" not in done.stderr
    assert (tmp_path / "out" / "run.jsonl").exists()
