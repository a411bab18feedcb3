"""``benchmarks.subsample_floor``: the hand-written floor computes Cockpit's values, and the run tabulates ratios."""

import json
import math

import pytest

from benchmarks import subsample_floor


@pytest.mark.parametrize("problem", ["mlp", "cnn", "transformer", "resnet_bn"])
def test_the_floor_gives_cockpits_values(problem):
    assert subsample_floor.agreement(problem, steps=2) < 1e-4


def test_the_agreement_sees_another_draw(monkeypatch):
    """The comparison can fail: a floor drawing other samples than the Cockpit's differs."""
    start = subsample_floor.Floor.start
    monkeypatch.setattr(subsample_floor.Floor, "start",
                        lambda self, step, outputs, targets: start(self, step + 1, outputs, targets))
    assert subsample_floor.agreement("mlp", steps=1) > 1e-2


def test_the_floor_checks_the_capture_and_fits_alpha():
    runner = subsample_floor.FloorRunner("mlp")
    for _ in range(3):
        runner.run_step()
    assert len(runner.floor.failed) == 0
    assert math.isfinite(runner.floor.alpha) and runner.floor.alpha >= -1


def test_a_short_run_writes_every_configuration_over_the_plain_step(capsys, tmp_path):
    out = tmp_path / "floor.json"
    subsample_floor.main(["--problems", "mlp", "--repeats", "1", "--steps", "1", "--json", str(out)])
    assert "Floor against Cockpit" in capsys.readouterr().out
    numbers = json.loads(out.read_text())["mlp"]
    assert set(numbers) == {"plain_ms", "difference", "floor", "floor, no histogram", "floor, no check", "economy"}
    assert all(v > 0 for k, v in numbers.items() if k != "difference")
