"""Test session hooks: one torch thread per parallel worker, and the accuracy table gathered by
``problems.assert_close`` (from every worker when the suite runs with ``-n``)."""

import os

# Tests that set two torch threads share the cores with the other workers: OpenMP's default
# busy-waiting then makes them ~6x slower (measured: 163 s against 22 s for five diagnosis
# scenarios with two workers on two cores). Read when the OpenMP runtime starts, so before torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import problems


@pytest.fixture
def one_rank(tmp_path):
    """A process group of this process alone (gloo): FSDP2's ``fully_shard`` on one rank."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


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
