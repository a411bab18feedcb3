"""``python -m instruments`` renders logs offline, torn ones included, and compares runs."""

import os
import subprocess
import sys
import warnings

import pytest
from conftest import _ROOT
from matplotlib.image import imread

from instruments import cli

import records


def _torn_log(path, record):
    records.write_jsonl(str(path), record)
    with open(path, "rb") as file:
        content = file.read()
    last_start = content.rstrip(b"\n").rfind(b"\n") + 1
    cut = last_start + (len(content) - last_start) // 2  # in the middle of the last line
    with open(path, "wb") as file:
        file.write(content[:cut])
    return path


def test_torn_log_renders_and_warns_once(tmp_path, full_record, capsys):
    log = _torn_log(tmp_path / "crashed.jsonl", full_record)
    out = tmp_path / "dash.png"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main([str(log), "-o", str(out), "--dpi", "40"]) == 0
    torn = [w for w in caught if "incomplete" in str(w.message)]
    assert len(torn) == 1, [str(w.message) for w in caught]
    assert imread(out).shape[:2] == (400, 640)
    assert capsys.readouterr().out.strip() == str(out)


def test_default_output_next_to_log(tmp_path, full_record):
    log = records.write_jsonl(str(tmp_path / "run.jsonl"), records.economy_record())
    cli.main([log, "--dpi", "30", "--size", "12", "8"])
    assert imread(tmp_path / "run.png").shape[:2] == (240, 360)


def test_compare_cli(tmp_path, full_record, economy_record):
    a = records.write_jsonl(str(tmp_path / "a.jsonl"), full_record)
    b = _torn_log(tmp_path / "b.jsonl", economy_record)
    out = tmp_path / "cmp.png"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli.main([a, str(b), "--compare", "-o", str(out), "--labels", "lr 0.1", "lr 1", "--dpi", "30",
                  "--rows", "alpha", "grad_norm", "performance"])
    assert len([w for w in caught if "incomplete" in str(w.message)]) == 1
    assert os.path.exists(out)


def test_several_logs_need_compare(tmp_path, full_jsonl):
    with pytest.raises(SystemExit):
        cli.main([full_jsonl, full_jsonl])


def test_python_dash_m(tmp_path, full_jsonl):
    out = tmp_path / "m.png"
    result = subprocess.run([sys.executable, "-m", "instruments", full_jsonl, "-o", str(out), "--dpi", "30"],
                            cwd=_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(out)
    assert os.path.exists(out)


def test_missing_log_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(tmp_path / "nope.jsonl")])
    assert exit_info.value.code == 2
    assert "no log at" in capsys.readouterr().err


def test_diagnose_prints_findings_then_tables_without_torch(tmp_path):
    from cockpit_lite import log

    header = {"params": [{"name": "0.weight", "shape": [3, 6]}, {"name": "0.bias", "shape": [3]}]}
    writer = log.JSONLinesWriter(str(tmp_path / "run.jsonl"), header)
    for step in range(4):
        writer.append(step, {"Loss": 1.0, "GradNorm": [0.1, 0.01], "ParamNorm": [1.0, 0.1],
                             "InputStats": {"mean": 120.0, "std": 70.0, "min": 0.0, "max": 255.0, "nonfinite": 0.0},
                             "ActivationStats": {"1": {"type": "ReLU", "mean": 0.3, "std": 0.5, "zeros": 0.4,
                                                       "dead": 0.1, "saturated": None}}})
    writer.close()
    code = ("import sys; from instruments import cli; cli.main(['diagnose', sys.argv[1]]);"
            "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run.jsonl")], cwd=_ROOT, check=True,
                         capture_output=True, text=True).stdout
    assert out.index("unnormalized_inputs") < out.index("activations (step 3)") < out.index("parameters (step 3)")
    assert "0.weight" in out and "ReLU" in out


def test_diagnose_missing_log_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["diagnose", str(tmp_path / "nope.jsonl")])
    assert stop.value.code == 2


def test_the_dashboard_is_written_atomically(tmp_path, full_jsonl, monkeypatch):
    from matplotlib.figure import Figure

    def savefig(self, fname, **kwargs):
        with open(fname, "wb") as file:
            file.write(b"\x89PNG half")
        raise KeyboardInterrupt  # killed while saving

    monkeypatch.setattr(Figure, "savefig", savefig)
    out = tmp_path / "dash.png"
    with pytest.raises(KeyboardInterrupt):
        cli.main([full_jsonl, "-o", str(out), "--dpi", "20"])
    assert os.listdir(tmp_path) == ["run.jsonl"]  # no dash.png, no temporary file


def test_a_second_run_on_the_same_log_is_drawn_and_the_first_is_kept(tmp_path, economy_record, capsys):
    log = str(tmp_path / "run.jsonl")
    records.write_jsonl(log, economy_record)
    records.write_jsonl(log, {s: e for s, e in economy_record.items() if s < 5})
    assert cli.main([log, "-o", str(tmp_path / "a.png"), "--dpi", "20"]) == 0
    assert "2 run segments" in capsys.readouterr().err
    assert cli.main(["diagnose", log, "--segment", "0"]) == 0
