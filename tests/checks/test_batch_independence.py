"""Batch independence: BatchNorm in eval mode (said so), tokens differentiated at the embedding."""

import torch
from check_cases import BROKEN, CASES

from cockpit_lite import checks

NAMES = ["batch_independence_forward", "batch_independence_backward"]


def _run(case, **options):
    return checks.run(case.model, case.loss_fn, case.batch, **{**case.options, **options}, checks=NAMES)


def test_batchnorm_in_eval_mode_is_said():
    report = _run(CASES["bn_cnn"]())
    assert report.passed == NAMES
    assert all("BatchNorm2d (2) in eval mode" in report[n].message for n in NAMES)


def test_tokens_are_differentiated_at_the_input_embedding():
    report = _run(CASES["causal_transformer"]())
    assert report.passed == NAMES
    assert "`embed`" in report["batch_independence_backward"].message  # not the position embedding


def test_mixing_is_measured_and_fixed():
    report = _run(BROKEN["batch_mixing"]())
    assert report["batch_independence_forward"].value > 1e-2
    assert "x.mean(0)" in report["batch_independence_backward"].fix


def test_a_batch_of_one_is_inconclusive_and_asks_for_two_samples():
    case = CASES["digits_mlp"]()
    x, y = case.batch
    report = checks.run(case.model, case.loss_fn, (x[:1], y[:1]), checks=NAMES)
    assert report.inconclusive == NAMES and report.ok
    assert all("at least 2 samples" in report[name].fix for name in NAMES)


def test_integer_inputs_without_embedding_skip_the_backward_check():
    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(5, 3))

        def forward(self, ids):
            return self.table[ids]

    ids = torch.randint(0, 5, (6,))
    report = checks.run(Lookup(), torch.nn.CrossEntropyLoss(), (ids, ids % 3), checks=NAMES)
    assert report.passed == ["batch_independence_forward"]
    assert "no nn.Embedding" in report["batch_independence_backward"].message
