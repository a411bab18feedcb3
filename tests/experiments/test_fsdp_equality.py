"""``experiments.fsdp_equality``'s comparison of histograms (its runs are tests/test_sharded.py's)."""

import numpy as np

from experiments.fsdp_equality import histograms_agree


def test_counts_may_move_only_between_the_two_bins_around_zero_of_each_axis():
    counts = np.arange(24).reshape(4, 6)
    across_gradient_zero = counts.copy()
    across_gradient_zero[1, 4] -= 2
    across_gradient_zero[2, 4] += 2
    across_both_zeros = counts.copy()
    across_both_zeros[1, 2] -= 1
    across_both_zeros[2, 3] += 1
    elsewhere = counts.copy()
    elsewhere[0, 4] -= 1
    elsewhere[1, 4] += 1
    along_a_row = counts.copy()  # the same gradient bin, another parameter bin away from 0
    along_a_row[1, 0] -= 1
    along_a_row[1, 1] += 1
    assert histograms_agree(across_gradient_zero, counts)
    assert histograms_agree(across_both_zeros, counts)
    assert not histograms_agree(elsewhere, counts)
    assert not histograms_agree(along_a_row, counts)
    assert not histograms_agree(counts[:, :4], counts)
    line = np.array([3, 1, 4, 1, 5, 9])
    assert histograms_agree(line + np.array([0, 0, 2, -2, 0, 0]), line)
    assert not histograms_agree(line + np.array([0, 2, -2, 0, 0, 0]), line)
