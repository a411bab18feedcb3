"""Every reader (``cockpit_lite.log``, ``instruments.load``, ``diagnose``, the CLI) validates what it reads.

A file that is not a record gives one ``ValueError`` naming the file, the line and the
field (the CLI: one line ``error: ...``, exit status 2, never a traceback); sizes are
bounded (decompressed arrays, lists, nesting) with an error that names the limit and
the fix, and the fix works. Text from a file is drawn literally (no mathtext).
"""

import base64
import gzip
import json
import os
import re
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from conftest import _ROOT

from cockpit_lite import log
from cockpit_lite.diagnosis import diagnose
from instruments import cli, data

HEADER = json.dumps({"format": "cockpit-lite", "version": 1, "run": "r1", "params": [{"name": "w", "shape": [2]}]})
GOOD = json.dumps({"step": 0, "Loss": 1.0, "GradNorm": [0.1, 0.2]})


def _deep(depth):
    return "[" * depth + "]" * depth


def _bomb(shape=(2**27,)):
    """A json_tricks b64.gz array: ~1 MB of text that inflates to 1 GiB of zeros."""
    payload = base64.standard_b64encode(gzip.compress(bytes(8 * int(np.prod(shape))), compresslevel=9)).decode()
    return {"__ndarray__": "b64.gz:" + payload, "dtype": "float64", "shape": list(shape), "Corder": True}


FINDING = {"kind": "dead_relu", "severity": "warning", "message": "m", "step": 0, "layer": "fc1",
           "suggestion": None, "evidence": {"fraction": 0.9}}
"""A well-formed finding (``cockpit_lite.diagnosis.Finding`` as recorded)."""

# (name, lines after the header, line number, what the message must say)
BAD_LINES = {
    "number": (["5"], 2, "JSON object"),
    "list": (["[1, 2]"], 2, "JSON object"),
    "null": (["null"], 2, "JSON object"),
    "string step": ([json.dumps({"step": "3", "Loss": 1.0})], 2, "field 'step'.*expected an integer, got \"3\""),
    "no step": ([json.dumps({"Loss": 1.0})], 2, "field 'step'.*missing"),
    "flags a number": ([json.dumps({"step": 0, "flags": 5})], 2, re.escape("field 'flags': expected a list of strings, got 5")),
    "loss a string": ([json.dumps({"step": 0, "Loss": "low"})], 2, "field 'Loss'.*expected a number or null, got \"low\""),
    "epoch loss a string": ([json.dumps({"step": 0, "train_loss": [0.5, "low"]})], 2,
                            r"field 'train_loss'.*expected a number, null or a list of numbers, got \[0.5, \"low\"\]"),
    "grad norm a dict": ([json.dumps({"step": 0, "GradNorm": {"a": 1}})], 2,
                         re.escape("field 'GradNorm': expected a list of numbers (one per parameter), got {\"a\": 1}")),
    "finding not a dict": ([json.dumps({"step": 0, "findings": [5]})], 2,
                           "field 'findings'.*expected a finding \\(a dict\\), got 5"),
    "finding without kind": ([json.dumps({"step": 0, "findings": [{"step": 0, "severity": "error",
                                                                    "message": "m"}]})], 2,
                             "findings.kind.*expected a string, got null"),
    **{f"finding {key} {what}": ([json.dumps({"step": 0, "findings": [{**FINDING, key: value}]})], 2,
                                 f"findings.{key}.*expected {expected}, got {shown}")
       for key, what, value, expected, shown in [
           ("kind", "a number", 5, "a string", "5"),
           ("layer", "a number", 5, "a string or null", "5"),
           ("suggestion", "a list", [], "a string or null", r"\[\]"),
           ("step", "a string", "3", "an integer", '"3"'),
           ("evidence", "a list", [1], "a dict or null", r"\[1\]")]},
    "ragged histogram": ([json.dumps({"step": 0, "GradHist1d": {"hist": [[1, 2], [3]], "edges": [0, 1]}})], 2,
                         "GradHist1d.hist"),
    "histogram with a null": ([json.dumps({"step": 0, "GradHist1d": {"hist": [None], "edges": [0, 1]}})], 2,
                              "GradHist1d.hist.*expected an array of numbers"),
    "text histogram": ([json.dumps({"step": 0, "GradHist1d": {"hist": ["a", "b"], "edges": [0, 1, 2]}})], 2,
                       "GradHist1d.hist.*numbers"),
    "batch a number": ([json.dumps({"step": 0, "batch": 5})], 2,
                       r"field 'batch'.*expected a dict \{'size': B, 'accumulated': bool, 'passes': k\}, got 5"),
    "batch size a string": ([json.dumps({"step": 0, "batch": {"size": "8"}})], 2,
                            "field 'batch.size'.*expected a number or null, got \"8\""),
    "activation stats not dicts": ([json.dumps({"step": 0, "ActivationStats": {"1": 5}})], 2,
                                   re.escape("field 'ActivationStats.1': expected a dict of statistics, got 5")),
    "deep nesting": ([json.dumps({"step": 0, "Custom": json.loads(_deep(500))})], 2, "nested deeper than the limit max_depth=64"),
    "very deep nesting": (['{"step": 0, "Custom": ' + _deep(100_000) + "}"], 2, "nested too deeply.*not a record"),
    "object dtype": ([json.dumps({"step": 0, "GradHist1d": {"hist": {"__ndarray__": [1], "dtype": "O",
                                                                      "shape": [1]}}})], 2, "not a number type"),
    "bad utf-8 in the middle": (["\udcff", GOOD], 2, "not valid JSON"),
    "corrupt line in the middle": (['{"step": 0, "Lo', GOOD], 2, "not valid JSON"),
    **{what: ([json.dumps({"step": 0, **entry})], 2, re.escape(message)) for what, entry, message in [
        ("grad norm item a string", {"GradNorm": [0.1, "a"]}, "field 'GradNorm': expected a number or null, got \"a\""),
        ("histogram a list", {"GradHist1d": [1]},
         "field 'GradHist1d': expected a histogram {'hist': [...], 'edges': [...]}, got [1]"),
        ("findings a dict", {"findings": {}}, "field 'findings': expected a list of findings, got {}"),
        ("layers a list", {"layers": [1]}, "field 'layers': expected a dict {quantity: per-layer list}, got [1]"),
        ("layer values a number", {"layers": {"NormTest": 5}},
         "field 'layers.NormTest': expected a list (one value per parameter), got 5"),
        ("layer value a string", {"layers": {"NormTest": ["a"]}},
         "field 'layers.NormTest': expected numbers or histograms, got \"a\""),
        ("meta a list", {"meta": [1]}, "field 'meta': expected a dict, got [1]"),
        ("budget a number", {"budget": 5}, "field 'budget': expected a dict, got 5"),
        ("activation stats a list", {"ActivationStats": [1]},
         "field 'ActivationStats': expected a dict {module: statistics}, got [1]"),
        ("activation stat a list", {"ActivationStats": {"fc1": {"dead": [1]}}},
         "field 'ActivationStats.fc1.dead': expected a number, a string or null, got [1]"),
        ("input stats a list", {"InputStats": [1]}, "field 'InputStats': expected a dict of statistics, got [1]"),
        ("input stat a string", {"InputStats": {"mean": "a"}},
         "field 'InputStats.mean': expected a number or null, got \"a\"")]},
    "two corrupt lines": (['{"step": 0, "Lo', '{"step": 1, "Lo', GOOD], 2, "not valid JSON"),
    "huge integer": ([json.dumps({"step": 0, "Loss": 10**400})], 2, "field 'Loss'"),
    "integer beyond a float": ([json.dumps({"step": 0, "Loss": 2**1024 - 1})], 2, "field 'Loss'"),
}


def _write_lines(path, lines, header=HEADER):
    with open(path, "wb") as file:
        for line in ([header] if header else []) + lines:
            file.write(line.encode("utf-8", "surrogateescape") + b"\n")
    return str(path)


@pytest.fixture(params=sorted(BAD_LINES))
def bad_log(request, tmp_path):
    lines, number, message = BAD_LINES[request.param]
    return _write_lines(tmp_path / "bad.jsonl", lines), number, message


def test_log_read_names_file_line_and_field(bad_log):
    path, number, message = bad_log
    with pytest.raises(ValueError, match=f"bad.jsonl, line {number}.*{message}") as raised:
        log.read(path)
    assert isinstance(raised.value, log.RecordError)


def test_the_other_readers_give_the_same_error(bad_log):
    path, number, message = bad_log
    with pytest.raises(ValueError, match=f"line {number}.*{message}"):
        data.load(path)
    with pytest.raises(ValueError, match=f"line {number}.*{message}"):
        diagnose(path)


BAD_HEADERS = {
    "version a string": (json.dumps({"format": "cockpit-lite", "version": "2"}), "field 'version'.*integer"),
    "newer version": (json.dumps({"format": "cockpit-lite", "version": 99}), "newer"),
    "params not a list": (json.dumps({"format": "cockpit-lite", "version": 1, "params": 5}),
                          re.escape("field 'params': expected a list of {'name', 'shape'}, got 5")),
    "foreign format": (json.dumps({"format": "tensorboard"}), "field 'format'.*not a cockpit-lite log"),
    "no header": (GOOD, "field 'format'.*header"),
    **{what: (json.dumps({"format": "cockpit-lite", "version": 1, **fields}), re.escape(message))
       for what, fields, message in [
        ("run a number", {"run": 5}, "field 'run': expected a string (the run id), got 5"),
        ("resumed_after a string", {"run": "r1", "resumed_after": "3"},
         "field 'resumed_after': expected an integer (a step), got \"3\""),
        ("a parameter without a name", {"params": [{"shape": [2]}]},
         "field 'params': expected {'name': str, 'shape': [int, ...]}, got {\"shape\": [2]}"),
        ("a negative parameter shape", {"params": [{"name": "w", "shape": [-1]}]},
         "field 'params.shape': expected a list of non-negative integers, got [-1]"),
        ("quantities not names", {"quantities": ["Loss", 5]},
         "field 'quantities': expected a list of quantity names, got [\"Loss\", 5]")]},
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_bad_headers(tmp_path, case):
    header, message = BAD_HEADERS[case]
    path = _write_lines(tmp_path / "h.jsonl", [GOOD], header=header)
    with pytest.raises(ValueError, match=f"h.jsonl, line 1.*{message}"):
        log.read_jsonl(path)


BAD_JSON = {
    "a number": ("5", "expected a record"),
    "a list": ("[1, 2]", "expected a record"),
    "null": ("null", "expected a record"),
    "a step that is no integer": (json.dumps({"abc": {}}), "key 'abc' is not a step"),
    "a step that is no dict": (json.dumps({"0": 5}), r"step '0'.*expected a step record \(a JSON object\), got 5"),
    "flags a number": (json.dumps({"0": {"flags": 5}}), "step '0', field 'flags'"),
    "deep nesting": (json.dumps({"0": {"Custom": json.loads(_deep(500))}}), "step '0'.*max_depth"),
    "very deep nesting": ('{"0": {"Custom": ' + _deep(100_000) + "}}", "nested too deeply"),
    "not json": ('{"0": {"Loss": 1.0', "line 1.*not valid JSON"),
    "ragged array": (json.dumps({"0": {"GradHist1d": {"hist": {"__ndarray__": [[1, 2], [3]], "shape": [2, 2]}}}}),
                     "GradHist1d.hist"),
    "shape that does not fit": (json.dumps({"0": {"GradHist1d": {"hist": {"__ndarray__": [1, 2, 3],
                                                                          "shape": [2]}}}}), "shape"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_files(tmp_path, case):
    text, message = BAD_JSON[case]
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"r.json.*{message}"):
        log.read(path)
    with pytest.raises(ValueError, match=message):
        diagnose(str(path))


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_a_decompression_bomb_is_refused_fast_and_the_named_fix_works(tmp_path, suffix):
    bomb = _bomb()
    path = tmp_path / f"bomb{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps({"0": {"Custom": bomb}}))
    else:
        _write_lines(path, [json.dumps({"step": 0, "Custom": bomb})])
    assert os.path.getsize(path) < 2 * 2**20
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"max_array_bytes.*raise it: limits=\{'max_array_bytes': N\}"):
            log.read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20  # refused before inflating anything (the bomb is 1 GiB)
    # the fix the message names works (a small array here: the same file layout, a trusted size)
    small = _bomb((2**20,))  # 8 MiB
    if suffix == ".json":
        path.write_text(json.dumps({"0": {"Custom": small}}))
    else:
        _write_lines(path, [json.dumps({"step": 0, "Custom": small})])
    with pytest.raises(ValueError, match="max_array_bytes"):
        log.read(path, limits={"max_array_bytes": 2**20})
    assert log.read(path, limits={"max_array_bytes": 2**23})[0]["Custom"].shape == (2**20,)


def test_an_array_whose_data_inflates_beyond_its_shape_is_refused(tmp_path):
    lying = _bomb((2**10,))
    lying["__ndarray__"] = "b64.gz:" + base64.standard_b64encode(gzip.compress(bytes(2**24))).decode()
    path = _write_lines(tmp_path / "lie.jsonl", [json.dumps({"step": 0, "Custom": lying})])
    with pytest.raises(ValueError, match="line 2, field 'Custom'.*more than 8,192 bytes.*need 8,192"):
        log.read(path)


def test_a_huge_list_is_bounded_and_the_limit_is_configurable(tmp_path):
    path = _write_lines(tmp_path / "big.jsonl", [json.dumps({"step": 0, "Custom": [0] * (2**22 + 1)})])
    with pytest.raises(ValueError, match="line 2, field 'Custom'.*max_items"):
        log.read(path)
    assert len(log.read(path, limits={"max_items": 2**23})[0]["Custom"]) == 2**22 + 1
    old = log.LIMITS["max_items"]
    try:  # the process-wide default, as the message says
        log.LIMITS["max_items"] = 2**23
        assert len(data.load(path).record[0]["Custom"]) == 2**22 + 1
    finally:
        log.LIMITS["max_items"] = old


def test_the_item_limit_counts_every_list_and_dict_element_of_a_line(tmp_path):
    """``max_items`` bounds a line's list and dict elements in all: its one key besides the step and its ten
    list items are 11."""
    path = _write_lines(tmp_path / "items.jsonl", [json.dumps({"step": 0, "Custom": [0] * 10})])
    assert log.read(path, limits={"max_items": 11})[0]["Custom"] == [0] * 10
    with pytest.raises(ValueError, match="line 2, field 'Custom'.*max_items"):
        log.read(path, limits={"max_items": 10})


def test_an_overlong_line_is_refused_without_reading_it(tmp_path):
    path = _write_lines(tmp_path / "long.jsonl", [json.dumps({"step": 0, "Custom": "x" * 5000}), GOOD])
    for read in (log.read, log.segments):
        with pytest.raises(ValueError, match="line 2: line longer than.*max_line_bytes"):
            read(path, limits={"max_line_bytes": 1000})


def test_good_files_still_read(tmp_path):
    path = _write_lines(tmp_path / "ok.jsonl", [GOOD, json.dumps({"step": 1, "flags": ["nonfinite_loss"], "Time": 5000,
                                                                  "Custom": {"any": ["json", 1, None]},
                                                                  "findings": [FINDING]})])
    record = log.read(path)
    assert record[0]["GradNorm"] == [0.1, 0.2] and record[1]["Custom"] == {"any": ["json", 1, None]}
    assert record[1]["findings"] == [FINDING] and record[1]["Time"] == 5000


# ----------------------------------------------------------------------------- the command line


def _cli(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    return stop.value.code, lines


def test_cli_one_error_line_and_status_2_for_every_bad_log(bad_log, capsys, tmp_path):
    path, number, message = bad_log
    for argv in ([path, "-o", str(tmp_path / "x.png")], ["diagnose", path]):
        code, lines = _cli(argv, capsys)
        assert code == 2 and len(lines) == 1, lines
        assert lines[0].startswith("error: ") and "bad.jsonl" in lines[0] and f"line {number}" in lines[0]
    assert not os.path.exists(tmp_path / "x.png")


@pytest.mark.parametrize("case", ["a number", "a step that is no dict", "very deep nesting", "not json"])
def test_cli_bad_json_files(tmp_path, capsys, case):
    path = tmp_path / "r.json"
    path.write_text(BAD_JSON[case][0])
    for argv in ([str(path), "-o", str(tmp_path / "x.png")], ["diagnose", str(path)]):
        code, lines = _cli(argv, capsys)
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "r.json" in lines[0], lines


def test_cli_limit_flag_is_the_fix_it_names(tmp_path, capsys):
    path = _write_lines(tmp_path / "big.jsonl", [json.dumps({"step": 0, "Loss": 1.0, "Custom": [0] * 2000})])
    code, lines = _cli([path, "--limit", "max_items=1000", "-o", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "--limit max_items=N" in lines[0]
    with pytest.raises(SystemExit) as stop:
        cli.main(["diagnose", path, "--limit", "max_items=1000"])
    assert stop.value.code == 2
    assert cli.main(["diagnose", path, "--limit", "max_items=5000"]) == 0


def test_python_dash_m_prints_no_traceback(tmp_path):
    path = _write_lines(tmp_path / "bad.jsonl", [json.dumps({"step": 0, "flags": 5})])
    for argv in ([path], ["diagnose", path]):
        result = subprocess.run([sys.executable, "-m", "instruments", *argv], cwd=_ROOT, capture_output=True,
                                text=True)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines() == [
            f"error: {path}, line 2, field 'flags': expected a list of strings, got 5"]


def test_help_lists_diagnose():
    result = subprocess.run([sys.executable, "-m", "instruments", "--help"], cwd=_ROOT, capture_output=True,
                            text=True, check=True)
    assert "diagnose" in result.stdout


def test_finding_text_with_dollars_is_drawn_literally(tmp_path, economy_record):
    import records

    record = {s: dict(e) for s, e in economy_record.items()}
    last = max(record)
    record[last]["findings"] = [{"kind": "lr_too_high", "layer": "$x^{$", "step": last, "severity": "error",
                                 "message": r"the loss rose by $\undefined$ and $5 $x^{$",
                                 "suggestion": "lower it to $0.01$", "evidence": {}}]
    path = records.write_jsonl(str(tmp_path / "dollars.jsonl"), record)
    out = tmp_path / "d.png"
    assert cli.main([path, "-o", str(out), "--dpi", "30"]) == 0
    assert os.path.getsize(out) > 0


def test_cli_says_which_segment_it_draws(tmp_path, capsys, economy_record):
    import records

    path = str(tmp_path / "two.jsonl")
    records.write_jsonl(path, economy_record)
    records.write_jsonl(path, {s: e for s, e in economy_record.items() if s < 10})  # a second run, same log
    assert cli.main([path, "-o", str(tmp_path / "last.png"), "--dpi", "30"]) == 0
    err = capsys.readouterr().err
    assert "2 run segments" in err and "drawing the last" in err
    assert cli.main([path, "--segment", "0", "-o", str(tmp_path / "first.png"), "--dpi", "30"]) == 0
    assert data.load(path).record.keys() == {s for s in economy_record if s < 10}
    assert data.load(path, segment=0).record.keys() == economy_record.keys()
    capsys.readouterr()
    code, lines = _cli([path, "--segment", "5"], capsys)
    assert code == 2 and "2 run segment(s)" in lines[0]
