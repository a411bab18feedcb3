"""``python -m experiments.hess_max_ev_starts``: HessMaxEV's misses by its number of start vectors."""

import pytest

from experiments import hess_max_ev_starts as starts


def test_both_solvers_follow_one_trajectory_and_the_table_prints(capsys):
    values, exact = starts.run("cnn", 0, 3)
    assert len(exact) == 3 and exact[0] != exact[2]  # (trained)
    for block in (1, 2):
        for (value, products), reference in zip(values[block], exact):
            assert value == pytest.approx(reference, rel=2e-3) and products >= 1
    starts.main(["--seeds", "1", "--steps", "2", "--problems", "cnn"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["problem", "block"] and [line.split()[:2] for line in lines[2:]] == [
        ["cnn", "1"], ["cnn", "2"]]
