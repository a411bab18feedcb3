"""The main job: the digits demo, end to end in a tiny configuration."""

import json

import pytest

from experiments import demo


def test_demo_writes_log_record_and_one_dashboard_per_epoch(tmp_path, capsys):
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
