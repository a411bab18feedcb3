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


def test_at_most_max_batches_and_a_parameter_the_loss_does_not_use():
    """25 batches, the default ``max_batches`` 20: the first 20 norms; a parameter outside the forward pass
    has no gradient and adds nothing (the norms are those of the used parameters, by hand)."""
    class WithSpare(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.spare = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.used(x)

    torch.manual_seed(0)
    model, loss_fn = WithSpare(), torch.nn.functional.cross_entropy
    batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(25)]
    suggestion = checks.suggest_clip_value(model, loss_fn, batches)
    manual = []
    for x, y in batches[:20]:
        grads = torch.autograd.grad(loss_fn(model(x), y), list(model.used.parameters()))
        manual.append(float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))))
    np.testing.assert_allclose(suggestion.norms, manual, rtol=1e-5)
    assert float(suggestion) == pytest.approx(float(np.percentile(manual, 90)), rel=1e-5)  # the default percentile


def test_the_default_seed_is_0_and_targets_need_not_be_tensors():
    """Dropout draws from the seeded, forked random state (the default is seed 0's); a loss that ignores its
    targets may be given ``None`` for them (a reconstruction loss)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 4))
    batches = [(torch.randn(8, 4), None) for _ in range(3)]

    def reconstruction(output, target):
        return output.pow(2).mean()

    norms = [checks.suggest_clip_value(model, reconstruction, batches, **seed).norms
             for seed in ({}, {"seed": 0}, {"seed": 1})]
    assert norms[0] == norms[1] and norms[0] != norms[2]
