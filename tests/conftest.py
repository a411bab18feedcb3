"""Test session hooks: print the accuracy table gathered by ``problems.assert_close``."""

import problems


def pytest_terminal_summary(terminalreporter):
    if not problems.MAX_RELATIVE_ERRORS:
        return
    terminalreporter.section("max relative error vs brute-force float64 references")
    for name, error in sorted(problems.MAX_RELATIVE_ERRORS.items()):
        terminalreporter.write_line(f"{name:<22} {error:.1e}")
