"""Fixtures for the instrument tests: synthetic records (see ``records.py``), headless matplotlib."""

import os
import sys

import matplotlib
import pytest

matplotlib.use("Agg")  # before anything imports pyplot

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
for path in (_HERE, _ROOT):  # `import records`, `import cockpit_lite` without installing
    if path not in sys.path:
        sys.path.insert(0, path)

import records  # noqa: E402

#: Small, low-resolution figures keep the suite fast; layout logic is the same.
FAST = {"dpi": 40}


@pytest.fixture(scope="session")
def full_record():
    return records.full_record()


@pytest.fixture(scope="session")
def economy_record():
    return records.economy_record()


@pytest.fixture(params=["full", "economy"])
def any_record(request, full_record, economy_record):
    return {"full": full_record, "economy": economy_record}[request.param]


@pytest.fixture
def names():
    return list(records.NAMES)


@pytest.fixture
def ax():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3), dpi=40, layout="constrained")
    return fig.add_subplot()


@pytest.fixture
def full_jsonl(tmp_path, full_record):
    return records.write_jsonl(str(tmp_path / "run.jsonl"), full_record)
