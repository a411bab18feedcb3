"""The comparison view puts runs side by side on shared axes."""

import os

import pytest
from figure_text import all_titles

from instruments import Run, compare, data

import records


@pytest.fixture
def runs(full_record, economy_record):
    slow = {s: dict(e, Loss=e["Loss"] * 3) for s, e in records.full_record(seed=2).items()}
    return [Run(full_record, records.NAMES, "a"), Run(slow, records.NAMES, "b"), Run(economy_record, None, "c")]


def test_compare_columns_and_rows(tmp_path, runs):
    out = tmp_path / "cmp.png"
    fig = compare(runs, labels=["η=0.1", "η=1", "η=10"], savepath=out, dpi=30)
    assert os.path.exists(out)
    columns = fig.subfigs[1].subfigs
    assert [c._suptitle.get_text() for c in columns] == ["η=0.1", "η=1", "η=10"]
    titles = all_titles(fig)
    assert sum(t.startswith("α, last 10%") for t in titles) == 3
    finals = [data.recent(data.series(run.record, "Loss")[1]) for run in runs]
    best = ["η=0.1", "η=1", "η=10"][finals.index(min(finals))]
    assert any(t.startswith("mini-batch loss, smoothed") and f"lowest recent median: {best}" in t for t in titles)


def test_rows_share_y_range(runs):
    fig = compare(runs, rows=("performance", "grad_norm"), overlay=False)
    columns = [[a for a in column.axes if a.get_title()] for column in fig.subfigs]
    for row in range(2):
        limits = {tuple(axes[row].get_ylim()) for axes in columns}
        assert len(limits) == 1, limits
        assert len({axes[row].get_yscale() for axes in columns}) == 1


def test_default_labels_are_file_names(tmp_path, full_record, economy_record):
    a = records.write_jsonl(str(tmp_path / "lr_0.1.jsonl"), full_record)
    b = records.write_jsonl(str(tmp_path / "lr_1.jsonl"), economy_record)
    fig = compare([a, b], rows=("alpha",))
    assert [c._suptitle.get_text() for c in fig.subfigs[1].subfigs] == ["lr_0.1", "lr_1"]


def test_single_run_and_errors(full_record):
    compare([full_record], rows=("alpha",))
    with pytest.raises(KeyError, match="nope"):
        compare([full_record], rows=("nope",))
    with pytest.raises(ValueError):
        compare([])
    with pytest.raises(ValueError, match="labels"):
        compare([full_record], labels=["a", "b"])
