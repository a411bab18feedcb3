"""``CheckResult`` and ``Report``: three outcomes, readable text, one AssertionError for all failures."""

import pytest

from cockpit_lite.checks import CheckResult, Report


def _report():
    return Report([
        CheckResult("a", True, 1.0, "<= 2", "fine"),
        CheckResult("b", False, 3.0, "<= 2", "too big", "make it smaller"),
        CheckResult.skip("c", "does not apply"),
    ], seconds=0.5)


def test_statuses_and_lookup():
    report = _report()
    assert (report.passed, report.failed, report.skipped) == (["a"], ["b"], ["c"])
    assert report["c"].status == "skipped" and report["c"].passed is None
    assert not report.ok and len(report) == 3 and "a" in report
    with pytest.raises(KeyError, match="has a, b, c"):
        report["d"]


def test_text_has_one_line_per_check_and_the_fix_under_failures():
    text = str(_report())
    assert text.splitlines()[0].startswith("pre-flight checks: 1 passed, 1 failed, 1 skipped")
    assert "FAIL  b" in text and "fix: make it smaller" in text and "SKIP  c" in text and "does not apply" in text


def test_raise_if_failed_lists_every_failure():
    with pytest.raises(AssertionError, match="b: too big Fix: make it smaller"):
        _report().raise_if_failed()
    ok = Report([CheckResult("a", True)])
    assert ok.raise_if_failed() is ok
    assert ok.seconds == 0.0 and str(ok).splitlines()[0].endswith("(0.0 s)")  # (no time given)


def test_raise_if_failed_names_no_fix_for_a_failure_without_one():
    with pytest.raises(AssertionError) as raised:
        Report([CheckResult("a", True), CheckResult("b", False, 3.0, "<= 1", "too big")]).raise_if_failed()
    assert str(raised.value) == "1 pre-flight check(s) failed:\n- b: too big"


def test_a_value_is_written_as_an_integer_when_it_is_one():
    """3 and 3.0 as "3"; others to three digits; a float of 10⁶ or more (the bound excluded) and non-finite values
    as Python writes them."""
    values = [3, 3.0, 0.25, 999999.0, 1e6, 2e6, float("nan")]
    assert [str(CheckResult("a", True, v, "", "m")).split()[2] for v in values] == [
        "3", "3", "0.25", "999999", "1e+06", "2e+06", "nan"]


def test_a_line_has_fixed_columns_and_the_fix_only_under_a_failure_or_an_inconclusive_check():
    """Label, name (27 wide), value (9, right-aligned; blank without one), threshold (9) and message; no trailing
    blanks; the fix on a second line, as "fix" under a failure and "to decide" under an inconclusive check, never
    under a pass, even when one is given."""
    under = "\n" + " " * 34
    assert str(CheckResult("a", True, 1.0, "<= 2", "", "unused")) == "PASS  a" + " " * 35 + "1 <= 2"
    assert str(CheckResult.skip("c", "does not apply")) == "SKIP  c" + " " * 47 + "does not apply"
    assert str(CheckResult("b", False, 3.0, "<= 2", "too big", "make it smaller")) == (
        "FAIL  b" + " " * 35 + "3 <= 2      too big" + under + "fix: make it smaller")
    assert str(CheckResult("d", None, None, "", "cannot tell", "pass more data", inconclusive=True)) == (
        "????  d" + " " * 47 + "cannot tell" + under + "to decide: pass more data")


def test_an_inconclusive_result_keeps_its_value_and_has_no_threshold_unless_given():
    bare = CheckResult.undecided("a", "too few", "pass more")
    assert (bare.value, bare.threshold, bare.message, bare.fix) == (None, "", "inconclusive: too few", "pass more")
    assert CheckResult.undecided("a", "too few", "pass more", 2.5, "<= 10").value == 2.5
