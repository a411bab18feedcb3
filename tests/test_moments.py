"""``cockpit_lite.utils.moments.pooled`` against numpy on the union of the parts."""

import numpy as np
import pytest
import torch

from cockpit_lite.utils.moments import pooled


@pytest.mark.parametrize("seed", range(5))
def test_parts_pooled_match_the_whole(seed):
    """Parts of 5, 0, 1 and 13 entries far from zero (mean 1e9, std 1e-2: ``Σx² − n·mean²`` in float64 loses
    it all): the mean to 1e-15 and ``Σ(x − mean)²`` to 1e-4 of numpy's on the concatenation (each part's mean,
    rounded at 1e9·2⁻⁵³, enters the spread between the parts: 4·10⁻⁶ on these seeds)."""
    g = np.random.default_rng(seed)
    parts = [1e9 + 1e-2 * g.standard_normal(n) for n in (5, 0, 1, 13)]
    counts = torch.tensor([float(len(p)) for p in parts], dtype=torch.float64)
    sums = torch.tensor([p.sum() for p in parts], dtype=torch.float64)
    within = torch.tensor([((p - p.mean()) ** 2).sum() if len(p) else 0.0 for p in parts], dtype=torch.float64)
    mean, deviations = pooled(counts, sums, within)
    whole = np.concatenate(parts)
    assert float(mean) == pytest.approx(whole.mean(), rel=1e-15)
    assert float(deviations) == pytest.approx(((whole - whole.mean()) ** 2).sum(), rel=1e-4)
