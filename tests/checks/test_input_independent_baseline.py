"""``input_independent_baseline``: a model that ignores its input trains identically on zeros."""

import pytest
import torch
from check_cases import BROKEN, CASES

from cockpit_lite import checks
from cockpit_lite.checks import input_independent_baseline
from cockpit_lite.checks.problem import Problem


def _result(case):
    return checks.run(case.model, case.loss_fn, case.batch, **case.options,
                      checks=["input_independent_baseline"])["input_independent_baseline"]


def test_ignoring_the_input_gives_a_ratio_of_one():
    result = _result(BROKEN["ignores_input"]())
    assert result.value == 1.0 and result.passed is False and "does not use its input" in result.fix


def test_a_ratio_at_the_bound_passes(monkeypatch):
    """The documented bound is inclusive: a final loss on real inputs of exactly ``RATIO`` times the
    zero-input one passes (hand-made losses 0.9 and 1.0; the held-out comparison a clear pass)."""
    from cockpit_lite.checks import input_independent_baseline as module

    assert module.RATIO == 0.9
    losses = iter([0.9, 1.0])  # real inputs, then zeros
    monkeypatch.setattr(module, "_trained", lambda problem, x, y: (None, next(losses)))
    monkeypatch.setattr(module, "_held_out", lambda problem: (0.2, "held-out: hand-made", None))
    result = _result(CASES["regression_mlp"]())
    assert result.value == 0.9 and result.passed is True


class _NormalisedPerSample(__import__("torch").nn.Module):
    """Each sample divided by its own norm before a Linear layer: an all-zero input is 0/0 (NaN), a real
    one is fine (timm's EfficientNet-B0 on zeroed inputs ended NaN the same way)."""

    def __init__(self):
        import torch

        super().__init__()
        self.linear = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.linear(x / x.norm(dim=1, keepdim=True))


def test_a_non_finite_zero_input_run_is_inconclusive_not_an_ignored_input():
    """The non-finite zero-input loss read as a ratio of 1: a FAIL saying the model does not use its input.
    Now inconclusive, with both losses, the reason and what it means."""
    import math

    import torch

    case = CASES["digits_mlp"]()
    result = checks.run(_NormalisedPerSample(), case.loss_fn, case.batch,
                        checks=["input_independent_baseline"])["input_independent_baseline"]
    assert result.passed is None and math.isnan(result.value), result
    assert result.message.startswith("inconclusive: training on zeroed inputs gave a non-finite loss (nan after 30")
    assert "does not use its input" not in result.fix and "all-zero inputs" in result.fix
    assert torch.isnan(_NormalisedPerSample()(torch.zeros(2, 64))).all()


def test_token_and_regression_models_beat_zeroed_inputs():
    for name in ("causal_transformer", "regression_mlp", "lstm_classifier"):
        assert _result(CASES[name]()).value < 0.5


def _shuffled(case):
    """The batch's labels permuted apart from their inputs (the loader's bug); data['test'] stays clean."""
    import torch

    x, y = case.batch
    permuted = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    return checks.run(case.model, case.loss_fn, (x, permuted), **case.options,
                      checks=["input_independent_baseline"])["input_independent_baseline"]


def test_labels_shuffled_apart_from_their_inputs_fail_on_held_out_samples():
    for name in ("digits_mlp", "regression_mlp"):
        result = _shuffled(CASES[name]())
        assert result.passed is False and "held-out" in result.message and "shuffled" in result.fix, result


def test_healthy_models_beat_zeroed_inputs_on_held_out_samples():
    for name in ("digits_mlp", "bn_cnn", "lstm_classifier", "regression_mlp"):
        result = _result(CASES[name]())
        assert result.passed and "held-out" in result.message, result


def test_without_data_the_batch_is_split():
    case = CASES["digits_mlp"]()
    options = {k: v for k, v in case.options.items() if k != "data"}
    result = checks.run(case.model, case.loss_fn, case.batch, **options,
                        checks=["input_independent_baseline"])["input_independent_baseline"]
    assert result.passed and "second half of the batch" in result.message, result


def _imbalanced_case(share=0.85):
    """All digits, subsampled so that ``share`` of the labels are class 0: a batch of 64 and the
    rest held out (about 140 samples)."""
    import torch

    from check_cases import digits, digits_case, mlp

    (x, y), (xt, yt) = digits()
    x, y = torch.cat([x, xt]), torch.cat([y, yt])
    others, zeros = (y != 0).nonzero().flatten(), (y == 0).nonzero().flatten()
    keep = torch.cat([zeros, others[: int(len(zeros) * (1 - share) / share)]])
    keep = keep[torch.randperm(len(keep), generator=torch.Generator().manual_seed(0))]
    x, y = x[keep], y[keep]
    case = digits_case(mlp())
    case.batch = (x[:64], y[:64])
    case.options["data"] = {"x_train": x[:64], "y_train": y[:64], "x_test": x[64:], "y_test": y[64:]}
    return case


def test_imbalanced_labels_are_no_failure():
    """85 % of one class: the input-free guess scores about 86 %, a gain of 10 points is out of reach
    for a healthy model trained 30 steps (it reaches about 90 %: it used to fail). The needed gain
    shrinks with the headroom, and 145 held-out samples cannot resolve it: inconclusive, saying why."""
    result = _result(_imbalanced_case())
    assert result.status == "inconclusive", result
    assert "cannot resolve the gain" in result.message and "data=" in result.fix


def test_labels_shuffled_apart_from_imbalanced_inputs_never_pass():
    import torch

    case = _imbalanced_case()
    x, y = case.batch
    permuted = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    result = checks.run(case.model, case.loss_fn, (x, permuted), **case.options,
                        checks=["input_independent_baseline"])["input_independent_baseline"]
    assert result.status != "passed", result


def test_without_data_a_failed_held_out_half_is_inconclusive_and_says_what_to_pass():
    """Labels shuffled within the batch and no data=: the half split from the batch cannot
    decide; the result says so and names data=, and never fails the run."""
    import torch

    case = CASES["digits_mlp"]()
    options = {k: v for k, v in case.options.items() if k != "data"}
    x, y = case.batch
    permuted = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    report = checks.run(case.model, case.loss_fn, (x, permuted), **options, checks=["input_independent_baseline"])
    result = report["input_independent_baseline"]
    assert result.status == "inconclusive" and result.passed is None, result
    assert "data=" in result.fix and "inconclusive on held-out samples" in result.message, result
    assert report.inconclusive == ["input_independent_baseline"] and report.ok
    report.raise_if_failed()
    assert "????" in str(report) and "to decide: pass data=" in str(report) and "1 inconclusive" in str(report)
    # the fix it names works: with a held-out split the same batch is decided (and fails: the labels are shuffled)
    decided = checks.run(case.model, case.loss_fn, (x, permuted), **case.options,
                         checks=["input_independent_baseline"])["input_independent_baseline"]
    assert decided.status == "failed", decided


def test_a_large_batch_without_data_is_still_only_the_batch():
    """Without data=, even a batch large enough to resolve the gain (256 held-out samples) is no
    held-out split: a failure there (labels shuffled within the batch) is inconclusive, and says so."""
    import torch

    case = CASES["digits_mlp"]()
    data = case.options["data"]
    options = {k: v for k, v in case.options.items() if k != "data"}
    x, y = data["x_train"][:512], data["y_train"][:512]
    permuted = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    result = checks.run(case.model, case.loss_fn, (x, permuted), **options,
                        checks=["input_independent_baseline"])["input_independent_baseline"]
    assert result.status == "inconclusive" and "split from the batch" in result.message, result


def test_the_held_out_samples_are_the_test_split_else_the_end_of_the_train_split():
    """With a test split: its first ``HELD`` samples. With a train split only: its last ``HELD`` samples,
    not its first, where the batch usually comes from (held out means not in the batch)."""
    import torch

    from cockpit_lite.checks.input_independent_baseline import HELD, _held_out_split
    from cockpit_lite.checks.problem import Problem

    x, y = torch.arange(700 * 4, dtype=torch.float32).reshape(700, 4), torch.arange(700) % 3
    model, batch = torch.nn.Linear(4, 3), (x[:32], y[:32])
    split = {"x_train": x[:100], "y_train": y[:100], "x_test": x[100:], "y_test": y[100:]}
    *_, xh, yh, where, from_batch = _held_out_split(Problem(model, torch.nn.functional.cross_entropy, batch,
                                                            data=split))
    assert torch.equal(xh, x[100:100 + HELD]) and torch.equal(yh, y[100:100 + HELD]) and not from_batch
    assert where == f"{HELD} samples of data['test']"
    *_, xh, yh, where, _ = _held_out_split(Problem(model, torch.nn.functional.cross_entropy, batch,
                                                   data={"x_train": x, "y_train": y}))
    assert torch.equal(xh, x[-HELD:]) and torch.equal(yh, y[-HELD:]) and where == f"{HELD} samples of data['train']"


@pytest.mark.parametrize("logits, y, error", [
    ([[2.0], [0.0], [0.5], [-1.0]], [1.0, 0.0, 1.0, 0.0], 0.0),  # one logit [B, 1]: class 1 where it is above 0
    ([2.0, 0.0, 0.5, -1.0], [1.0, 1.0, 0.0, 0.0], 0.5),  # one logit [B]: a logit of 0 is class 0
    ([[0.0, 1.0], [1.0, 0.0], [3.0, -3.0], [0.0, 0.5]], [1, 0, 1, 1], 0.25),  # two logits: the larger one
])
def test_the_held_out_error_rate_reads_one_logit_as_binary_and_more_as_classes(logits, y, error):
    logits, y = torch.tensor(logits), torch.tensor(y)
    problem = Problem(torch.nn.Identity(), None, (logits, y))
    assert input_independent_baseline._score(problem, torch.nn.Identity(), logits, y) == error


def test_a_split_without_its_targets_is_passed_over_and_numpy_splits_take_the_batchs_dtypes():
    """A test split without ``y_test`` is no held-out split (the train split's end is); float64 and int32 numpy
    arrays (as scikit-learn gives them) come out in the batch's float32 and int64."""
    from cockpit_lite.checks.input_independent_baseline import HELD, _held_out_split

    x, y = torch.randn(700, 4, dtype=torch.float64), torch.arange(700, dtype=torch.int32) % 3
    data = {"x_train": x.numpy(), "y_train": y.numpy(), "x_test": x[:50].numpy()}
    batch = (x[:32].float(), y[:32].long())
    *_, xh, yh, where, _ = _held_out_split(Problem(torch.nn.Linear(4, 3), torch.nn.functional.cross_entropy, batch,
                                                   data=data))
    assert where == f"{HELD} samples of data['train']" and (xh.dtype, yh.dtype) == (torch.float32, torch.int64)
    assert torch.equal(xh, x[-HELD:].float()) and torch.equal(yh, y[-HELD:].long())


@pytest.mark.parametrize("size, held", [(15, None), (16, 8), (17, 9)])
def test_without_data_a_batch_of_16_or_more_is_halved(size, held):
    """Its first half trains, the rest is held out; below 8 samples a half, no split."""
    from cockpit_lite.checks.input_independent_baseline import _held_out_split

    x, y = torch.randn(size, 4), torch.arange(size) % 3
    split = _held_out_split(Problem(torch.nn.Linear(4, 3), torch.nn.functional.cross_entropy, (x, y)))
    if held is None:
        assert split is None
        return
    x_train, _, x_held, _, where, from_batch = split
    assert torch.equal(x_train, x[: size - held]) and torch.equal(x_held, x[size - held:]) and from_batch
    assert where == f"the second half of the batch ({held} samples)"
