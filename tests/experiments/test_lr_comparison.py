"""``experiments.lr_comparison`` end to end at --tiny size (and its divergence handling)."""

import json
import math

import pytest

from experiments import lr_comparison

RUN_KEYS = {
    "lr", "seed", "steps", "diverged", "divergence", "alphas", "median_alpha", "median_alpha_last",
    "final_train_loss", "test_accuracy", "flags", "dead_hidden_layers",
}


TINY_ACCURACY = {0.03: 54 / 360, 0.3: 163 / 360}
"""Test accuracy of the --tiny runs (seed 0)."""


def test_tiny_run_writes_figure_and_numbers(tmp_path):
    summary = lr_comparison.main(["--tiny", "--out", str(tmp_path)])
    png, path = tmp_path / "lr_comparison.png", tmp_path / "lr_comparison.json"
    assert png.stat().st_size > 10_000
    data = json.loads(path.read_text())  # strict JSON: NaN would have been written as null
    assert {"config", "runs", "per_lr", "best_lr", "conclusion"} <= set(data)
    assert isinstance(data["conclusion"], str) and "median α" in data["conclusion"]
    assert len(data["runs"]) == len(data["config"]["lrs"]) * data["config"]["seeds"] >= 2
    for run in data["runs"]:
        assert RUN_KEYS <= set(run)
        assert not run["diverged"]
        # a stable learning rate: every step's α is a finite number, one per step but the last
        assert len(run["alphas"]) == run["steps"] - 1
        assert all(a is not None and math.isfinite(a) for a in run["alphas"])
        assert -1.0 <= run["median_alpha"] < 5
        # seeded: 54 and 163 of the 360 test digits (a few samples of slack for other thread counts)
        assert run["test_accuracy"] == pytest.approx(TINY_ACCURACY[run["lr"]], abs=3 / 360)
        assert math.isfinite(run["final_train_loss"])
    assert sorted(TINY_ACCURACY) == sorted(data["config"]["lrs"]) and summary["best_lr"] == 0.3


def test_nan_divergence_is_recorded_and_stops_the_run(tmp_path):
    summary = lr_comparison.main(["--tiny", "--lrs", "0.05", "1e38", "--out", str(tmp_path)])
    runs = {r["lr"]: r for r in summary["runs"]}
    bad = runs[1e38]
    assert bad["diverged"] and bad["divergence"] == "non-finite loss"
    assert bad["steps"] == 2  # step 0 makes θ infinite, step 1's loss is NaN: stopped there
    assert bad["recorded_nonfinite_loss_steps"] == [1]  # cockpit-lite flagged it
    assert bad["flags"].get("nonfinite_loss") == 1
    assert not runs[0.05]["diverged"]
    assert summary["best_lr"] == 0.05
    assert (tmp_path / "lr_comparison.png").exists()
    json.loads((tmp_path / "lr_comparison.json").read_text())


def test_conclusion_reads_the_grid():
    def run(lr, alpha, acc, diverged=False):
        return {"lr": lr, "seed": 0, "median_alpha": alpha, "median_alpha_first5pct": alpha, "test_accuracy": acc,
                "diverged": diverged, "dead_hidden_layers": False}

    runs = [run(0.01, -0.3, 0.8), run(0.1, 0.2, 0.95), run(1.0, 1.5, 0.5), run(10.0, float("nan"), 0.1, True)]
    text, stats, best = lr_comparison.conclude(runs, 0.2)
    assert best == 0.1
    assert "slightly above 0" in text and "as the paper found" in text
    assert stats[10.0]["n_diverged"] == 1
