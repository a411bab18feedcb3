"""tools/mutation.py's test order in the copy it runs mutmut in: the fastest tests first, by the
durations of mutmut's stats run, so that ``-x`` stops a killed mutant at its first cheap failure."""

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
