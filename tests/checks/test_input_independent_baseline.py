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
    assert result.status == "inconclusive" and math.isnan(result.value), result
    assert result.threshold == "<= 0.9 (held-out <= 0.7)"
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


def _by_hand(monkeypatch, scores, losses=None):
    """``_trained`` and ``_score`` replaced: the model trained on zeroed inputs is "zero", the other "real"; their
    held-out scores are ``scores``; ``losses`` (if given) their final training losses. Returns the ``x`` each
    training got."""
    seen = []

    def trained(problem, x, y):
        seen.append(x)
        tag = "zero" if not bool(x.any()) else "real"
        return tag, (losses or {}).get(tag, 1.0)

    monkeypatch.setattr(input_independent_baseline, "_trained", trained)
    monkeypatch.setattr(input_independent_baseline, "_score", lambda problem, model, x, y: scores[model])
    return seen


def _classification(y_test, num_classes=None, task="classification"):
    """A problem whose held-out split is ``y_test`` (inputs of ones)."""
    y_test = torch.as_tensor(y_test)
    data = {"x_test": torch.ones(len(y_test), 3), "y_test": y_test}
    batch = (torch.ones(16, 3), torch.zeros(16, *y_test.shape[1:], dtype=y_test.dtype))  # (the split takes its dtype)
    return Problem(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy, batch, task, num_classes, data)


@pytest.mark.parametrize("num_classes, needed", [(10, "0.033"), (None, "0.06")])
def test_the_gain_needed_shrinks_with_the_input_free_guess_headroom(monkeypatch, num_classes, needed):
    """70 of 100 held-out labels are class 0: the best constant guess scores 70 % (better than the zero-input
    model's 50 %). Its headroom is (1 − 0.7) / (1 − 1/C) with C the larger of ``num_classes`` and the classes
    present (at least 2): 1/3 of 0.1 with C = 10, 0.6 of it with C = 2. Two standard errors of the guess,
    2·√(0.7·0.3/100) = 0.092, exceed both: a real-input error of 0.25 (a gain of 0.05) cannot decide."""
    _by_hand(monkeypatch, {"real": 0.25, "zero": 0.5})
    ratio, note, undecided = input_independent_baseline._held_out(_classification([0] * 70 + [1] * 30, num_classes))
    assert ratio == float("inf")
    assert note == "held-out error rate 0.25 vs 0.3 on zeroed inputs (100 samples of data['test'])"
    assert undecided == (f"an input-free guess scores 70%: 100 held-out samples cannot resolve the gain of {needed} "
                         "that shows the inputs predict the labels (2 standard errors: 0.092)")


def test_the_classes_present_count_and_a_held_out_split_of_one_class_needs_nothing(monkeypatch):
    """Five classes present (num_classes not given): C = 5, the headroom of a 60 % guess is 0.4 / 0.8 = 0.5; a
    split of one class: the guess is right every time, no headroom, no gain to resolve, undecided (not a
    division by 1 − 1/1)."""
    _by_hand(monkeypatch, {"real": 0.3, "zero": 0.9})
    labels = ([0] * 6 + [1, 2, 3, 4]) * 50
    *_, undecided = input_independent_baseline._held_out(_classification(labels))
    assert undecided is None  # 500 samples: 2 standard errors (0.044) are below the 0.05 needed; decided
    ratio, _, _ = input_independent_baseline._held_out(_classification(labels))
    assert ratio == 0.0  # a gain of 0.7 − 0.6 = 0.1 > 0.05
    _by_hand(monkeypatch, {"real": 0.33, "zero": 0.9})
    assert input_independent_baseline._held_out(_classification(labels))[0] == 0.0  # 0.07 > 0.05 (not > 0.08: C = 2)
    _by_hand(monkeypatch, {"real": 0.36, "zero": 0.9})
    ratio, _, undecided = input_independent_baseline._held_out(_classification(labels))
    assert ratio == float("inf") and undecided is None  # a gain of 0.04 < 0.05 needed: decided, failed
    _by_hand(monkeypatch, {"real": 0.0, "zero": 0.5})
    ratio, note, undecided = input_independent_baseline._held_out(_classification([0] * 50))
    assert ratio == float("inf") and note.startswith("held-out error rate 0 vs 0 on zeroed inputs")
    assert undecided.startswith("an input-free guess scores 100%: 50 held-out samples cannot resolve the gain of 0 ")


def test_probability_targets_need_the_full_gain(monkeypatch):
    """One-hot (floating) held-out targets: no class counts, no constant guess, a headroom of 1 (0.1 needed)."""
    _by_hand(monkeypatch, {"real": 0.45, "zero": 0.5})
    targets = torch.nn.functional.one_hot(torch.arange(64) % 2, 2).float()
    ratio, note, undecided = input_independent_baseline._held_out(_classification(targets))
    assert ratio == float("inf") and note.startswith("held-out error rate 0.45 vs 0.5 on zeroed inputs")
    assert undecided == ("an input-free guess scores 50%: 64 held-out samples cannot resolve the gain of 0.1 that "
                         "shows the inputs predict the labels (2 standard errors: 0.12)")


@pytest.mark.parametrize("real, zero, ratio", [(0.1, 0.5, 0.2), (0.0, 0.0, 1.0), (0.3, 0.0, float("inf"))])
def test_a_regressions_held_out_ratio(monkeypatch, real, zero, ratio):
    """Real-input over zero-input held-out loss; a zero-input loss of 0: 1 if the real one is 0 too, else inf."""
    _by_hand(monkeypatch, {"real": real, "zero": zero})
    problem = _classification(torch.zeros(20, 1), task="regression")
    got, note, undecided = input_independent_baseline._held_out(problem)
    assert got == pytest.approx(ratio) and undecided is None
    assert note == f"held-out loss {real:.3g} vs {zero:.3g} on zeroed inputs (20 samples of data['test'])"


@pytest.mark.parametrize("real, undecided", [(0.7, False), (0.8, True)])
def test_a_regression_split_from_the_batch_decides_a_pass_only(monkeypatch, real, undecided):
    """Without data=: a held-out ratio of 0.7 (the bound, inclusive) is decided; 0.8 is left undecided."""
    _by_hand(monkeypatch, {"real": real, "zero": 1.0})
    problem = Problem(torch.nn.Linear(3, 1), torch.nn.functional.mse_loss, (torch.ones(16, 3), torch.zeros(16, 1)),
                      "regression")
    ratio, _, why = input_independent_baseline._held_out(problem)
    assert ratio == real and (why == "judged on 8 samples split from the batch only (no data=)") == undecided
    assert (why is None) != undecided


def test_the_result_by_hand(monkeypatch):
    """``check`` on hand-made final losses and held-out outcomes: 16 samples train; the ratio of the losses is the
    value; a held-out ratio of 0.7 (the bound) passes with no fix; an undecided one is inconclusive with the
    ratio; both losses 0 is a ratio of 1 (no input-free baseline beaten)."""
    problem = (torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy,
               (torch.ones(40, 3), torch.zeros(40, dtype=torch.long)))

    def run(losses, held):
        seen = _by_hand(monkeypatch, {}, losses)
        monkeypatch.setattr(input_independent_baseline, "_held_out", lambda problem: held)
        return checks.run(*problem, checks=["input_independent_baseline"])["input_independent_baseline"], seen

    result, seen = run({"real": 0.4, "zero": 0.8}, (0.7, "held-out: by hand", None))
    assert [len(x) for x in seen] == [16, 16]
    assert (result.passed, result.value, result.threshold, result.fix) == (True, 0.5, "<= 0.9 (held-out <= 0.7)", "")
    assert result.message == "after 30 steps: loss 0.4 on real inputs vs 0.8 on zeroed inputs; held-out: by hand"
    result, _ = run({"real": 0.4, "zero": 0.8}, (0.2, "held-out: by hand", "too few"))
    assert (result.status, result.value, result.threshold) == ("inconclusive", 0.5, "<= 0.9 (held-out <= 0.7)")
    assert result.message.startswith("inconclusive on held-out samples: too few; after 30 steps: loss 0.4 ")
    result, _ = run({"real": 0.0, "zero": 0.0}, (0.2, "held-out: by hand", None))
    assert (result.passed, result.value, result.threshold) == (False, 1.0, "<= 0.9 (held-out <= 0.7)")
    assert result.fix.startswith("the model does not use its input")


def test_dropout_is_off_in_the_trained_copies():
    """A dropout of 1 after the first layer zeroes every sample's features while it is on: the two copies would
    train alike (a ratio of 1, "does not use its input"); off, the real inputs win."""
    case = CASES["digits_mlp"]()
    model = torch.nn.Sequential(case.model[0], case.model[1], torch.nn.Dropout(1.0), *case.model[2:])
    result = checks.run(model, case.loss_fn, case.batch, **case.options,
                        checks=["input_independent_baseline"])["input_independent_baseline"]
    assert result.passed and result.value < 0.5, result
