"""Batch independence: BatchNorm in eval mode (said so), tokens differentiated at the embedding."""

import pytest
import torch
from check_cases import BROKEN, CASES, TokenTable

import problems

from cockpit_lite import checks
from cockpit_lite.checks import batch_independence

NAMES = ["batch_independence_forward", "batch_independence_backward"]


def _run(case, **options):
    return checks.run(case.model, case.loss_fn, case.batch, **{**case.options, **options}, checks=NAMES)


def test_batchnorm_in_eval_mode_is_said():
    report = _run(CASES["bn_cnn"]())
    assert report.passed == NAMES
    assert all("BatchNorm2d (2) in eval mode" in report[n].message for n in NAMES)
    assert report["batch_independence_forward"].message.startswith(
        "no dependence: changing one sample leaves the other samples' outputs unchanged")


def test_tokens_are_differentiated_at_the_input_embedding():
    report = _run(CASES["causal_transformer"]())
    assert report.passed == NAMES
    assert "`embed`" in report["batch_independence_backward"].message  # not the position embedding


@pytest.mark.parametrize("device", problems.CPU_AND_CUDA)
def test_mixing_is_measured_and_fixed(device):
    """Also on a GPU (the mask of the other samples is made on the input's device)."""
    case = BROKEN["batch_mixing"]()
    case.model.to(device)
    case.batch = tuple(t.to(device) for t in case.batch)
    report = _run(case)
    assert report["batch_independence_forward"].value > 1e-2
    assert "x.mean(0)" in report["batch_independence_backward"].fix


def test_a_batch_of_one_is_inconclusive_and_asks_for_two_samples():
    case = CASES["digits_mlp"]()
    x, y = case.batch
    report = checks.run(case.model, case.loss_fn, (x[:1], y[:1]), checks=NAMES)
    assert report.inconclusive == NAMES and report.ok
    for name in NAMES:
        assert report[name].message == "inconclusive: one sample has no other sample to leak into"
        assert report[name].fix == "pass a batch of at least 2 samples"
    assert checks.run(case.model, case.loss_fn, (x[:2], y[:2]), checks=NAMES).passed == NAMES  # (the fix)


def test_integer_inputs_without_embedding_skip_the_backward_check():
    ids = torch.randint(0, 5, (6,))
    report = checks.run(TokenTable(), torch.nn.CrossEntropyLoss(), (ids, ids % 3), checks=NAMES)
    assert report.passed == ["batch_independence_forward"]
    assert "no nn.Embedding" in report["batch_independence_backward"].message


class _OneSampleLeaks(torch.nn.Module):
    """Every sample's output also gets sample ``index``'s (a leak from one sample only)."""

    def __init__(self, index):
        super().__init__()
        self.linear, self.index = torch.nn.Linear(64, 10), index

    def forward(self, x):
        out = self.linear(x.flatten(1))
        index = self.index % len(x) if self.index is not None else len(x) // 2
        return out + 0.5 * out[index:index + 1]


@pytest.mark.parametrize("index", [0, None, -1], ids=["first", "middle", "last"])
def test_a_leak_from_the_first_the_middle_or_the_last_sample_only_is_found(index):
    """The checks change the first, the middle (``B // 2``) and the last sample."""
    case = CASES["digits_mlp"]()
    torch.manual_seed(0)
    assert len(case.batch[0]) >= 6  # (the middle is neither the first nor B // 3)
    report = checks.run(_OneSampleLeaks(index), case.loss_fn, case.batch, checks=NAMES)
    assert report.failed == NAMES, report
    forward = report["batch_independence_forward"]
    assert forward.message.startswith("relative leak ") and forward.message.endswith(
        ": changing sample j moves the outputs of other samples")
    assert forward.fix == batch_independence.FIX


def test_a_forward_leak_of_exactly_the_bound_passes(monkeypatch):
    """A leak equal to ``LEAK`` (a hand-set value) is no dependence, said as such."""
    from cockpit_lite.checks import dependence

    monkeypatch.setattr(dependence, "forward_leak", lambda *args: dependence.LEAK)
    case = CASES["digits_mlp"]()
    result = checks.run(case.model, case.loss_fn, case.batch, checks=NAMES[:1])["batch_independence_forward"]
    assert result.passed and result.value == dependence.LEAK and result.fix == ""
    assert result.message == "no dependence: changing one sample leaves the other samples' outputs unchanged"


class _OutputsOfTheNextSample(torch.nn.Module):
    """Each sample's output is computed from the next sample's input only: no gradient w.r.t. its own."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.linear(x.flatten(1).roll(1, 0))


def test_outputs_with_no_gradient_of_their_own_input_leak_infinitely():
    case = CASES["digits_mlp"]()
    torch.manual_seed(0)
    report = checks.run(_OutputsOfTheNextSample(), case.loss_fn, case.batch, checks=NAMES)
    assert report.failed == NAMES and report["batch_independence_backward"].value == float("inf"), report


class _EmbeddedTwice(torch.nn.Module):
    """The tokens embedded twice: per sample, and again for a branch that averages over the batch (the leak)."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(7, 4), torch.nn.Linear(4, 3)

    def forward(self, tokens):
        own = self.embed(tokens).mean(1)
        shared = self.embed(tokens).mean(1).mean(0, keepdim=True)
        return self.head(own + shared)


def test_a_leak_through_a_second_call_of_the_input_embedding_is_found():
    """Every call of the input embedding on the batch's tokens gives the one differentiated output: the
    gradient reaches it through the mixing branch too (through the first call alone the backward check
    passed)."""
    torch.manual_seed(0)
    batch = (torch.randint(0, 7, (6, 5)), torch.randint(0, 3, (6,)))
    report = checks.run(_EmbeddedTwice(), torch.nn.functional.cross_entropy, batch, checks=NAMES)
    assert report.failed == NAMES, report
    assert "`embed`" in report["batch_independence_backward"].message
