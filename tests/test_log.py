"""The record format on disk."""

import json

import numpy as np
import pytest

from cockpit_lite import log


def write_sample(path):
    writer = log.JSONLinesWriter(path, {"params": [{"name": "w", "shape": [2]}], "quantities": ["Loss"]})
    writer.append(0, {"Loss": 1.5, "layers": {"NormTest": [0.1, float("nan")]}, "flags": ["nonfinite_grad"]})
    writer.append(0, {"GradHist1d": {"hist": np.array([1, 2]), "edges": np.array([-1.0, 0.0, 1.0])}})
    writer.append(1, {"GradHist2d": {"hist": np.ones((2, 3), dtype=int), "edges": [np.zeros(3), np.zeros(4)]}})
    writer.append(1, {"Loss": 1.25})
    writer.close()


def test_round_trip_merges_parts_of_a_step(tmp_path):
    write_sample(tmp_path / "run.jsonl")
    header, record = log.read_jsonl(tmp_path / "run.jsonl")
    assert header["version"] == log.FORMAT_VERSION and header["params"][0]["name"] == "w"
    assert record[0]["Loss"] == 1.5 and np.isnan(record[0]["layers"]["NormTest"][1])
    assert record[0]["flags"] == ["nonfinite_grad"]
    np.testing.assert_array_equal(record[0]["GradHist1d"]["hist"], [1, 2])
    assert record[1]["GradHist2d"]["hist"].shape == (2, 3) and len(record[1]["GradHist2d"]["edges"]) == 2
    assert log.layer_values(record[0], "NormTest")[0] == 0.1
    assert log.layer_values(record[1], "Loss") is None


def test_torn_last_line_is_skipped_with_one_warning(tmp_path):
    path = tmp_path / "run.jsonl"
    write_sample(path)
    text = path.read_text()
    path.write_text(text[: len(text) - 7])
    with pytest.warns(UserWarning, match="last line .* incomplete") as caught:
        record = log.read(path)
    assert len(caught) == 1
    assert record[1].keys() == {"GradHist2d"}


def test_corruption_elsewhere_and_newer_versions_are_refused(tmp_path):
    path = tmp_path / "run.jsonl"
    write_sample(path)
    lines = path.read_text().split("\n")
    lines[2] = lines[2][:5]
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match="line 3"):
        log.read_jsonl(path)
    path.write_text(json.dumps({"format": log.FORMAT, "version": 99}) + "\n")
    with pytest.raises(ValueError, match="newer"):
        log.read_jsonl(path)


def test_json_file_layout(tmp_path):
    record = {3: {"Loss": 0.5, "GradNorm": [1.0, 2.0]}, 1: {"Loss": float("nan")}}
    log.write_json(tmp_path / "r.json", record)
    data = json.loads((tmp_path / "r.json").read_text())
    assert list(data) == ["1", "3"] and data["3"]["GradNorm"] == [1.0, 2.0]
    assert np.isnan(log.read(tmp_path / "r.json")[1]["Loss"])
