"""``experiments.gpu_check`` runs every part on the CPU (``--device cpu --quick``), records a part
that fails and goes on, skips what the time guard leaves no time for, and installs a missing
package from a folder of wheels."""

import json
import shutil
import sys
import time
import warnings
import zipfile
from types import SimpleNamespace

import torch

from experiments import gpu_check


def test_quick_run_on_the_cpu(tmp_path, capsys):
    # a budget no loaded machine exhausts: the time guard skipped a histogram row at a load average of 5
    gpu_check.main([str(tmp_path), "--device", "cpu", "--quick", "--budget", "3600"])
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = results["parts"]
    assert {p: parts[p]["status"] for p in gpu_check.PARTS} == {
        "correctness": "ok", "syncs": "not applicable", "histogram": "ok", "overhead": "ok", "memory": "not applicable"}
    tests = parts["correctness"]["tests"]
    assert tests["counts"] == {"passed": 1, "failed": 0, "skipped": 0, "errors": 0} and tests["exit"] == 0
    assert all(check["passed"] for check in parts["correctness"]["own_checks"].values())
    assert (tmp_path / "dashboard.png").stat().st_size > 0
    assert parts["syncs"]["verdict"]["passed"] and "cnn fp32 economy" in parts["syncs"]["steps"]
    rows = parts["histogram"]["rows"]
    assert len(rows) == 4 and all("ours" in row["ms"] and "put_ (Cockpit's approach)" in row["ms"] for row in rows)
    cnn = parts["overhead"]["models"][0]
    assert {"untracked", "diagnosis", "economy", "full", "Opacus", "torch.func"} <= set(cnn["ratio"])
    assert all(check["passed"] for check in cnn["checks"].values()) and "economy" in cnn["checks"]
    printed = capsys.readouterr().out
    assert printed.strip() == (tmp_path / "summary.txt").read_text().strip()
    assert "correctness: tests 1 passed" in printed and "overhead (step time / plain" in printed


def test_the_plugin_writes_one_line_per_outcome(tmp_path, monkeypatch):
    path = tmp_path / "reports.jsonl"
    monkeypatch.setenv(gpu_check.REPORTS_VARIABLE, str(path))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this suite's own worker, if any
    reports = [("call", "passed", ""), ("setup", "passed", ""), ("teardown", "passed", ""),
               ("call", "failed", "frame\nE   AssertionError: 1 != 2"), ("setup", "skipped", "")]
    for when, outcome, text in reports:
        gpu_check.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::x", when=when, outcome=outcome,
                                                           longreprtext=text))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["when"], line["outcome"]) for line in lines] == [("call", "passed"), ("call", "failed"),
                                                                   ("setup", "skipped")]
    assert lines[1]["message"].endswith("AssertionError: 1 != 2")


def test_a_failing_part_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch, capsys):
    def broken(ctx):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(gpu_check, "part_histogram", broken)
    gpu_check.main([str(tmp_path), "--device", "cpu", "--quick", "--parts", "histogram", "memory"])
    parts = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert parts["histogram"]["status"] == "error" and "RuntimeError: planted failure" in parts["histogram"]["error"]
    assert parts["memory"]["status"] == "not applicable"
    assert "histogram: error: RuntimeError: planted failure" in capsys.readouterr().out


def test_the_time_guard_skips_what_does_not_fit(tmp_path, capsys):
    gpu_check.main([str(tmp_path), "--device", "cpu", "--quick", "--budget", "1", "--parts", "overhead"])
    parts = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert parts["overhead"]["status"] == "skipped" and "time guard" in parts["overhead"]["reason"]


def test_largest_batch_doubles_then_bisects_to_an_eighth():
    lo, hi, trials = gpu_check.largest_batch(lambda b: b <= 300, 16, 4096, time.monotonic() + 60)
    assert lo <= 300 < hi and hi - lo <= lo // 8
    assert [b for b, _ in trials[:6]] == [16, 32, 64, 128, 256, 512]
    assert gpu_check.largest_batch(lambda b: True, 16, 1000, time.monotonic() + 60)[:2] == (1000, None)
    assert gpu_check.largest_batch(lambda b: b < 16, 16, 1000, time.monotonic() + 60)[:2] == (0, 16)


def test_batch_fits_runs_a_plain_and_an_economy_step(tmp_path):
    ctx = gpu_check.Context(torch.device("cpu"), True, tmp_path)
    spec = gpu_check.overhead_specs(quick=True)[-1]
    assert gpu_check.batch_fits(ctx, spec, economy=False)(2) and gpu_check.batch_fits(ctx, spec, economy=True)(2)


def test_largest_batch_stops_at_the_deadline():
    assert gpu_check.largest_batch(lambda b: True, 16, 4096, time.monotonic() - 1) == (0, None, [])


def _warn_like_a_sync():
    warnings.warn("called a synchronizing CUDA operation")


def test_sync_trace_records_where_and_when():
    with gpu_check.SyncTrace(cuda=False) as trace:
        trace.mark("backward")
        _warn_like_a_sync()
        warnings.warn("an unrelated warning")
    (sync,) = trace.syncs
    assert sync["phase"] == "backward" and "test_gpu_check.py" in sync["where"] and "_warn_like_a_sync" in sync["where"]
    result = {"histogram": {"syncs": []}, "steps": {
        "cnn fp32 plain": {"first step": [sync]},
        "cnn fp32 untracked": {"first step": [], "second step": [dict(sync, phase="enter")]},
        "cnn fp32 economy": {"first step": [dict(sync, phase="exit")], "second step": [sync]},
        "cnn fp32 diagnosis": {"due step 1": [], "not due step 11": [dict(sync, phase="forward")]},
        "cnn fp32 full": {"error": "..."},
    }}
    verdict = gpu_check.sync_verdict(result)
    assert (verdict["plain"], verdict["hooks"], verdict["step end"], verdict["diagnosis between"]) == (1, 1, 1, 1)
    assert not verdict["passed"] and verdict["untracked"] == 1 and sum(verdict["places"].values()) == 4


def test_missing_packages_are_installed_from_the_wheels(tmp_path, monkeypatch):
    name = "gpu_check_planted_package"
    with zipfile.ZipFile(tmp_path / f"{name}-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", "VALUE = 42\n")
        info = f"{name}-1.0.dist-info"
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    monkeypatch.setattr(gpu_check, "PACKAGES", {"torch": "torch", name: name, "gpu_check_absent": "gpu_check_absent"})
    monkeypatch.setattr(sys, "path", list(sys.path))
    folders, status = gpu_check.ensure_packages(tmp_path)
    assert status == {"torch": "present", name: "installed",
                      "gpu_check_absent": f"missing: no gpu_check_absent-*.whl in {tmp_path}"}
    assert sys.path[0] == folders[0]
    try:
        assert __import__(name).VALUE == 42
    finally:
        sys.modules.pop(name, None)
        for folder in folders:
            shutil.rmtree(folder)
