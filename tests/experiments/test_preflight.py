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
