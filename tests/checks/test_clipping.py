"""``suggest_clip_value``: the stated percentile of the total gradient norms, model untouched."""

import numpy as np
import pytest
import torch
from check_cases import CASES, digits

from cockpit_lite import checks


def test_percentile_of_observed_norms():
    case = CASES["digits_mlp"]()
    (x, y), _ = digits()
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 320, 32)]
    suggestion = checks.suggest_clip_value(case.model, case.loss_fn, batches, percentile=90)
    manual = []
    for bx, by in batches:
        grads = torch.autograd.grad(case.loss_fn(case.model(bx), by), list(case.model.parameters()))
        manual.append(float(torch.sqrt(sum((g ** 2).sum() for g in grads))))
    np.testing.assert_allclose(suggestion.norms, manual, rtol=1e-5)
    # the two norms are summed in different orders (float32): equal within rounding, not bit for bit
    assert float(suggestion) == pytest.approx(float(np.percentile(manual, 90)), rel=1e-5)
    assert "90th percentile of 10" in str(suggestion)
    assert all(p.grad is None for p in case.model.parameters())
