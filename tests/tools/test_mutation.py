"""tools/mutation.py's test order in the copy it runs mutmut in: the fastest tests first, by the
durations of mutmut's stats run, so that ``-x`` stops a killed mutant at its first cheap failure; the
in-process runs' bookkeeping."""

import json
import types

from tools import mutation


def order(tmp_path, monkeypatch, durations):
    namespace = {}
    exec(mutation.FAST_FIRST, namespace)  # the text appended to the copy's tests/conftest.py
    monkeypatch.chdir(tmp_path)
    if durations is not None:
        (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": durations}))
    items = [types.SimpleNamespace(nodeid=name) for name in ["t::slow", "t::new", "t::fast"]]
    namespace["pytest_collection_modifyitems"](items)
    return [item.nodeid for item in items]


def test_the_fastest_tests_run_first(tmp_path, monkeypatch):
    """A test the stats run did not see counts as 0 s; equal durations keep their order."""
    assert order(tmp_path, monkeypatch, {"t::slow": 19.5, "t::fast": 0.01}) == ["t::new", "t::fast", "t::slow"]


def test_without_a_stats_run_the_order_is_kept(tmp_path, monkeypatch):
    assert order(tmp_path, monkeypatch, None) == ["t::slow", "t::new", "t::fast"]


def test_the_copy_s_conftest_ends_with_the_hook(tmp_path, monkeypatch):
    """copy_clone writes the clone's tests/conftest.py and the hook after it, once, however often it copies."""
    monkeypatch.setattr(mutation, "narrowed", lambda config, group: config)
    for _ in range(2):
        mutation.copy_clone(str(tmp_path), "diagnosis_rules")
    text = (tmp_path / "tests" / "conftest.py").read_text()
    with open(mutation.os.path.join(mutation.ROOT, "tests", "conftest.py"), encoding="utf-8") as file:
        assert text == file.read() + mutation.FAST_FIRST


def test_in_process_runs_record_each_mutants_exit_code_in_mutmut_s_meta(tmp_path, monkeypatch):
    """The matching mutants without a result run, each with MUTANT_UNDER_TEST set, from the copy's mutants/
    directory; the exit code lands in the meta file; a result already there, a wording mutant and a mutant the
    globs do not match are left alone."""
    import os

    import pytest

    folder = tmp_path / "mutants" / "cockpit_lite" / "checks"
    folder.mkdir(parents=True)
    names = {f"cockpit_lite.checks.m.x_f__mutmut_{i}": None for i in range(1, 5)}
    names["cockpit_lite.checks.m.x_f__mutmut_1"] = 1
    names["cockpit_lite.checks.m.x_g__mutmut_1"] = None
    (folder / "m.py.meta").write_text(json.dumps({"exit_code_by_key": names, "other": "kept"}))
    runs = []

    def main(args):
        runs.append((os.environ["MUTANT_UNDER_TEST"], os.getcwd(), args[-1]))
        return 1 if runs[-1][0].endswith("_2") else 0

    monkeypatch.setattr(pytest, "main", main)
    monkeypatch.setattr(mutation, "wording_mutants", lambda workdir: {"cockpit_lite.checks.m.x_f__mutmut_4"})
    monkeypatch.chdir(tmp_path)
    mutation.run_in_process(str(tmp_path), ["*.x_f__*"], ["tests/checks/test_m.py"])
    assert [(name[-11:], os.path.basename(cwd), test) for name, cwd, test in runs] == [
        ("f__mutmut_2", "mutants", "tests/checks/test_m.py"), ("f__mutmut_3", "mutants", "tests/checks/test_m.py")]
    meta = json.loads((folder / "m.py.meta").read_text())
    assert meta["other"] == "kept" and meta["exit_code_by_key"] == {
        "cockpit_lite.checks.m.x_f__mutmut_1": 1, "cockpit_lite.checks.m.x_f__mutmut_2": 1,
        "cockpit_lite.checks.m.x_f__mutmut_3": 0, "cockpit_lite.checks.m.x_f__mutmut_4": None,
        "cockpit_lite.checks.m.x_g__mutmut_1": None}
    assert "MUTANT_UNDER_TEST" not in os.environ
