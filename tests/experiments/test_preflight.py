"""``python -m experiments.preflight``: both reports printed, the planted bugs fail, the figure is written."""

from experiments import preflight


def test_preflight_prints_both_reports_and_writes_the_lr_figure(tmp_path, capsys):
    reports, result = preflight.main(["--out", str(tmp_path), "--tiny"])
    printed = capsys.readouterr().out
    assert printed.count("pre-flight checks:") == 2
    assert reports["demo CNN"].failed == []
    assert set(reports["broken variant"].failed) == {"overfit_one_batch", "data_duplicates", "data_normalization"}
    assert "remove the softmax" in printed and "divide by 255" in printed
    assert (tmp_path / "lr_range.png").stat().st_size > 1000 and (tmp_path / "lr_range.csv").exists()
    assert len(result.lr) <= 30 and "clip gradients at" in printed


def test_calibrate_runs_each_case_with_and_without_data_and_tabulates_the_spread(capsys):
    rows = preflight.calibrate(1, ["digits_mlp", "huge_init"])
    assert [(r["case"], r["data"]) for r in rows] == [("digits_mlp", True), ("digits_mlp", False), ("huge_init", True)]
    assert rows[1]["results"]["data_duplicates"][0] == "inconclusive"  # no data=: it says what to pass
    table = dict((row[0], row) for row in preflight.spread(rows)["rows"])
    assert table["`init_loss`"][5] == "1 of 1" and table["`init_loss`"][3] == "2 passed"
    low, high = (float(v) for v in table["`init_loss`"][2].split(" – "))
    assert low == high <= 1.5 and float(table["`init_loss`"][4].split(" – ")[0]) > 1.5
