"""Test session hooks: one torch thread per parallel worker, and the accuracy table gathered by
``problems.assert_close`` (from every worker when the suite runs with ``-n``)."""

import os

import pytest
import torch

import problems


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # the workers share the cores: a second intra-op thread per worker only oversubscribes
        # them (tests that depend on the thread count set it themselves: tests/diagnosis)
        torch.set_num_threads(1)


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a worker: hand its table to the controller
        session.config.workeroutput["max_relative_errors"] = dict(problems.MAX_RELATIVE_ERRORS)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown without pytest-xdist
def pytest_testnodedown(node, error):
    """On the controller: merge a finished worker's table (kept as the largest error per name)."""
    for name, value in getattr(node, "workeroutput", {}).get("max_relative_errors", {}).items():
        problems.MAX_RELATIVE_ERRORS[name] = max(value, problems.MAX_RELATIVE_ERRORS.get(name, 0.0))


def pytest_terminal_summary(terminalreporter):
    if not problems.MAX_RELATIVE_ERRORS:
        return
    terminalreporter.section("max relative error vs brute-force float64 references")
    for name, error in sorted(problems.MAX_RELATIVE_ERRORS.items()):
        terminalreporter.write_line(f"{name:<22} {error:.1e}")
