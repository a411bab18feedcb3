"""The data checks: duplicates (exact and near-exact), imbalance, normalization, non-finite values."""

import re

import numpy as np
import pytest
import torch
from check_cases import BROKEN, CASES

from cockpit_lite import checks
from cockpit_lite.checks import data_imbalance, data_nonfinite
from cockpit_lite.checks.problem import Problem

DATA = ["data_duplicates", "data_imbalance", "data_normalization", "data_nonfinite"]


def _report(case, data=None, **options):
    options = {**case.options, **options}
    if data is not None:
        options["data"] = data
    return checks.run(case.model, case.loss_fn, case.batch, **options, checks=DATA)


def test_near_exact_duplicates_are_found():
    case = CASES["regression_mlp"]()
    data = dict(case.options["data"])
    data["x_test"] = data["x_test"].clone()
    data["x_test"][:3] = data["x_train"][:3].double().add(1e-9).float()  # a float64 round trip
    result = _report(case, data)["data_duplicates"]
    assert result.value == 3 and "test indices [0, 1, 2]" in result.message


def test_more_than_five_duplicates_are_elided_and_repeats_within_the_training_split_counted():
    """Seven test rows copied from the training split (the message lists five, then "..."); two training rows
    repeated within it."""
    case = CASES["regression_mlp"]()
    data = dict(case.options["data"])
    data["x_train"], data["x_test"] = data["x_train"].clone(), data["x_test"].clone()
    data["x_train"][1], data["x_train"][3] = data["x_train"][0], data["x_train"][2]
    data["x_test"][:7] = data["x_train"][10:17]
    result = _report(case, data)["data_duplicates"]
    assert result.value == 7 and "(test indices [0, 1, 2, 3, 4] ...)" in result.message, result.message
    assert result.message.endswith("; 2 repeated rows within the training split"), result.message


@pytest.mark.parametrize("empty", ["x_train", "x_test"])
def test_an_empty_split_leaves_the_duplicates_inconclusive_naming_it(empty):
    """An empty split cannot show a leak (it used to pass: "none of 0 test samples occurs ..."); the fix it
    names, non-empty splits, decides the check."""
    case = CASES["regression_mlp"]()
    data = dict(case.options["data"])
    given = dict(data, **{empty: data[empty][:0]})
    result = _report(case, given)["data_duplicates"]
    assert result.status == "inconclusive", result
    assert result.message == f"inconclusive: {empty} has no sample (shape (0, {data[empty].shape[1]}))"
    assert result.fix == "pass non-empty splits x_train and x_test"
    assert _report(case, data)["data_duplicates"].status == "passed"


def test_numpy_splits_of_a_small_scale_are_rounded_in_units_of_their_std():
    """numpy splits whose std is 1e-3: test rows 2e-5 (0.02 std) away from training rows are no duplicates, two
    exact copies are; rounding in absolute units (4 decimals) would merge most shifted rows with their originals."""
    case = CASES["regression_mlp"]()
    train = 1e-3 * np.random.default_rng(0).standard_normal((50, 3))
    shifted = train[:20] + 2e-5
    clean = _report(case, {"x_train": train, "x_test": shifted})["data_duplicates"]
    assert clean.passed and clean.value == 0 and clean.message == "none of 20 test samples occurs in the 50 training samples"
    leaked = _report(case, {"x_train": train, "x_test": np.concatenate([shifted, train[30:32]])})["data_duplicates"]
    assert leaked.value == 2 and "test indices [20, 21]" in leaked.message, leaked.message


def test_float16_inputs_are_measured_in_float64():
    """float16 inputs of std about 300: their squared deviations overflow float16 (> 65504); the fix names the
    training split's mean and std as numpy computes them in float64."""
    case = CASES["regression_mlp"]()
    rng = np.random.default_rng(0)
    train, test = [(300 * rng.standard_normal((64, 4)) + 20).astype(np.float16) for _ in range(2)]
    result = _report(case, {"x_train": train, "x_test": test})["data_normalization"]
    mean, std = map(float, re.search(r"x = \(x - (\S+)\) / (\S+)$", result.fix).groups())
    exact = train.astype(np.float64)
    assert result.passed is False
    np.testing.assert_allclose([mean, std], [exact.mean(), exact.std()], rtol=1e-3)


def test_without_data_two_checks_look_at_the_batch_and_two_are_inconclusive():
    case = CASES["digits_mlp"]()
    report = _report(case, data={})
    assert report.inconclusive == ["data_duplicates", "data_imbalance"] and report.skipped == []
    assert "data={'x_train'" in report["data_duplicates"].fix and "y_test" in report["data_imbalance"].fix
    assert report["data_imbalance"].message == "inconclusive: one batch is too small to count classes"
    assert report["data_duplicates"].message == "inconclusive: one batch cannot show a leak between splits"
    assert "the batch" in report["data_nonfinite"].message and report["data_normalization"].passed


def test_imbalanced_data_passes_a_skewed_split_fails_and_without_a_test_split_it_is_inconclusive():
    natural = CASES["natural_imbalance"]()  # 85 % of class 0 in both splits
    result = _report(natural, natural.options["data"])["data_imbalance"]
    assert result.passed and result.value > 10 and "the data is imbalanced, the split is not" in result.message
    assert result.threshold == "<= 10"
    skewed = BROKEN["imbalanced_labels"]()
    result = _report(skewed, skewed.options["data"])["data_imbalance"]
    assert result.passed is False and "skewed" in result.message
    train_only = {k: v for k, v in natural.options["data"].items() if k != "y_test"}
    result = _report(natural, train_only)["data_imbalance"]
    assert result.status == "inconclusive" and "y_test" in result.fix
    assert result.message.endswith("; without a test split, imbalanced data cannot be told from a skewed split")
    assert result.value > 10 and result.threshold == "<= 10"


@pytest.mark.parametrize("common, rare, test_labels, test_common", [(105, 7, 140, 140), (55, 5, 30, 20)])
def test_shares_exactly_three_standard_errors_apart_are_not_a_skewed_split(common, rare, test_labels, test_common):
    """``common`` labels of class 0 and ``rare`` of class 1 (ratio 15 and 11); the test split's share of class 0
    ``test_common / test_labels``. 105 of 112 against 140 of 140: shares 15/16 and 1, pooled 245/252 = 35/36, standard
    error sqrt(35/36 · 1/36 · (1/112 + 1/140)) = 1/48, so the shares are 1/16 = 3 standard errors apart; 55 of 60
    against 20 of 30: 11/12 and 2/3, pooled 5/6, error sqrt(5/36 · 1/20) = 1/12, 1/4 apart = 3 errors, and
    3 errors are the resolution 1/4 exactly (all exact in float64). Both bounds included: the data is imbalanced."""
    y_train = torch.cat([torch.zeros(common, dtype=torch.long), torch.ones(rare, dtype=torch.long)])
    y_test = (torch.arange(test_labels) >= test_common).long()
    problem = Problem(torch.nn.Identity(), None, (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)),
                      data={"y_train": y_train, "y_test": y_test})
    result = data_imbalance.check(problem)
    assert result.passed and "the data is imbalanced, the split is not" in result.message, result.message


def test_too_few_labels_per_class_are_inconclusive():
    small = CASES["small_data"]()  # 48 labels of 10 classes
    result = _report(small, small.options["data"])["data_imbalance"]
    assert result.status == "inconclusive" and "fewer than 5 labels per class" in result.message
    assert result.threshold == "<= 10" and result.value > 1 and result.fix.startswith("pass data={'y_train': ...")


def test_five_labels_per_class_are_enough():
    """10 classes, 5 labels each: the fewest that decide (balanced: passes at ratio 1)."""
    case = CASES["digits_mlp"]()
    data = dict(case.options["data"], x_train=case.options["data"]["x_train"][:50], y_train=torch.arange(10).repeat(5))
    result = _report(case, data)["data_imbalance"]
    assert result.passed and result.value == 1.0


@pytest.mark.parametrize("form", ["one_hot", "int_column", "float_indices"])
def test_labels_are_counted_as_classes_whatever_their_form(form):
    """Float one-hot rows count as their argmax; integer labels of shape [N, 1] and float class indices [N] as
    they are: 30 of class 0, 10 of class 1 and 10 of class 2 in every form (ratio 3)."""
    labels = torch.cat([torch.zeros(30), torch.ones(10), torch.full((10,), 2.0)]).long()
    y_train = {"one_hot": torch.nn.functional.one_hot(labels, 3).float(), "int_column": labels[:, None],
               "float_indices": labels.float()}[form]
    problem = Problem(torch.nn.Identity(), None, (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)),
                      data={"y_train": y_train})
    result = data_imbalance.check(problem)
    assert result.passed and result.value == 3.0 and result.threshold == "<= 10", result.message
    assert result.message == "class 0 has 30 samples, class 1 10 (3 classes, 50 labels)"


def test_imbalance_ratio_and_a_missing_class():
    case = CASES["digits_mlp"]()
    data = dict(case.options["data"])
    data["y_train"] = data["y_train"].clamp_max(8)  # no label 9 left
    result = _report(case, data)["data_imbalance"]
    assert result.value == float("inf") and result.passed is False


def test_normalization_names_the_fix():
    case = CASES["regression_mlp"]()
    data = dict(case.options["data"])
    data["x_train"] = data["x_train"].clone()
    data["x_train"][:, 2] *= 1e4  # one column in other units
    result = _report(case, data)["data_normalization"]
    assert result.passed is False and "feature 2" in result.message and "each feature" in result.fix
    data = dict(case.options["data"], x_test=case.options["data"]["x_test"] * 3 + 2)  # test split not normalised
    result = _report(case, data)["data_normalization"]
    assert result.passed is False and "not scaled like x_train" in result.message


@pytest.mark.parametrize("shift, factor, agrees", [
    (0.3, 1.0, True), (-0.3, 1.0, True), (0.7, 1.0, False), (-0.7, 1.0, False),  # means within half a train std
    (0.0, 1.5, True), (0.0, 0.6, True), (0.0, 2.5, False), (0.0, 0.4, False),    # stds within a factor of 2
])
def test_the_test_split_must_agree_with_the_training_split(shift, factor, agrees):
    """The test split is the training split moved by ``shift`` training stds and scaled by ``factor``
    about its mean: each split on its own is roughly standardised (|mean| about 0.7 at most, std 2.5 at most), so only
    the agreement decides, on values away from its bounds (a mean shifted by 0.7 std, not within 0.5)."""
    case = CASES["regression_mlp"]()
    train = case.options["data"]["x_train"].double()
    mean, std = train.mean(), train.std(unbiased=False)
    moved = (mean + (train - mean) * factor + shift * std).float()
    data = dict(case.options["data"], x_test=moved)
    result = _report(case, data)["data_normalization"]
    assert result.passed is agrees, result.message
    assert ("not scaled like x_train" in result.message) is not agrees
    assert result.value == pytest.approx(float(std), rel=1e-5)


@pytest.mark.parametrize("low, high, pixels", [
    (0.0, 255.0, True), (0.5, 255.0, True), (0.0, 2.0, True),  # 0 and 255 included, any top above 1
    (0.0, 256.0, False), (0.0, 1.0, False), (-1.0, 255.0, False),
])
def test_the_fix_takes_the_inputs_for_raw_pixels_only_from_0_to_at_most_255(low, high, pixels):
    """Training inputs at ``high`` but for 2 rows of 50 at ``low`` fail on their mean or their std (every feature
    alike); the fix reads them as raw pixels when they lie in [0, 255] and reach above 1, else it standardises."""
    train = np.full((50, 4), high)
    train[:2] = low
    result = _report(CASES["regression_mlp"](), {"x_train": train})["data_normalization"]
    assert result.passed is False, result.message
    if pixels:
        assert result.fix == f"the inputs look like raw pixels in 0..{high:.0f}: divide by {high:.0f} (or standardise)"
    else:
        assert result.fix.startswith("standardise with the training split's statistics: x = (x - "), result.fix


def test_a_feature_exactly_100_times_the_median_std_is_not_singled_out():
    """Features of stds 1, 1 and exactly 100 about a mean of 5: the spread is at its bound (allowed); the inputs
    fail on their mean and std, and the fix standardises them as a whole, not feature by feature."""
    train = np.tile([[6.0, 6.0, 105.0], [4.0, 4.0, -95.0]], (10, 1))
    result = _report(CASES["regression_mlp"](), {"x_train": train})["data_normalization"]
    assert result.passed is False and "feature" not in result.message, result.message
    assert result.fix == "standardise with the training split's statistics: x = (x - 5) / 57.74", result.fix
    train[:, 2] = 5 + (train[:, 2] - 5) * 1.01  # just beyond the bound
    result = _report(CASES["regression_mlp"](), {"x_train": train})["data_normalization"]
    assert "feature 2 has 101x the median feature std" in result.message and "each feature" in result.fix


@pytest.mark.parametrize("values, passed", [
    ([0.5, 1.5], True), ([-0.2, 0.2], True), ([-5.0, 5.0], True),  # |mean| = 1, std = 0.2 and std = 5: the bounds
    ([0.0, 0.0], False),  # constant inputs: std 0 (and no feature varies)
])
def test_mean_and_std_bounds_are_included(values, passed):
    """Two features, each taking both values (means and stds exact in float64)."""
    train = np.array([values, values[::-1]])
    result = _report(CASES["regression_mlp"](), {"x_train": train})["data_normalization"]
    assert result.passed is passed, result.message
    assert passed or result.message == "x_train: mean 0, std 0; x_train: std outside [0.2, 5]"


def test_constant_features_are_left_out_of_the_median_std():
    """MNIST-like inputs: three constant features (its border pixels) beside two of std 0.5 and one of std 75 (150
    times theirs: singled out); without the wide one, the constant ones do not make the others look wide."""
    signs = np.tile([1.0, -1.0], 10)[:, None]
    train = np.hstack([np.zeros((20, 3)), 0.5 * signs, 0.5 * signs, 75 * signs])
    result = _report(CASES["regression_mlp"](), {"x_train": train})["data_normalization"]
    assert "feature 5 has 150x the median feature std" in result.message, result.message
    result = _report(CASES["regression_mlp"](), {"x_train": train[:, :5]})["data_normalization"]
    assert result.passed, result.message


@pytest.mark.parametrize("rows", [1, 2])
def test_one_or_two_finite_training_rows(rows):
    """One finite row has no spread per feature (std 0: none singled out); two rows already give each feature's
    std: the third feature's is 1000 times the others', singled out."""
    train = np.array([[1.0, 1.0, 1000.0], [-1.0, -1.0, -1000.0], [np.nan, 0.0, 0.0]])[[*range(rows), 2]]
    result = _report(CASES["regression_mlp"](), {"x_train": train})["data_normalization"]
    assert result.passed is False and "raised" not in result.message, result.message
    assert ("feature 2 has 1e+03x the median feature std" in result.message) is (rows == 2), result.message


@pytest.mark.parametrize("split, shape, nan", [("x_train", (10, 0), False), ("x_train", (0, 3), False),
                                               ("x_train", (4, 3), True), ("x_test", (0, 3), False)])
def test_normalization_without_a_finite_sample_is_inconclusive_naming_the_split(split, shape, nan):
    """A split with no sample (an empty split), no values per sample, or no sample of finite values only:
    inconclusive, naming the split and its shape; the fix it names, a finite sample, decides the check."""
    case = CASES["regression_mlp"]()
    data = {"x_train": np.tile([[1.0], [-1.0]], (3, 3))}
    data[split] = np.full(shape, np.nan if nan else 1.0)
    result = _report(case, data)["data_normalization"]
    assert result.status == "inconclusive", result.message
    assert result.message == f"inconclusive: {split} ({shape[0]} samples of {shape[1]} values) has no sample of finite values only"
    assert result.fix == "pass inputs with at least one sample of finite values (see data_nonfinite)"
    data[split] = np.concatenate([np.full(shape, np.nan), np.ones((1, shape[1]))]) if shape[1] else np.ones((2, 3))
    assert _report(case, data)["data_normalization"].status in ("passed", "failed")


def test_token_inputs_are_not_normalised():
    result = _report(CASES["causal_transformer"]())["data_normalization"]
    assert result.status == "skipped" and result.message == "integer inputs (token ids or indices) are not normalised"


def test_complex_inputs_are_searched_for_nonfinite_values():
    """A complex split is a float one: an entry of imaginary part NaN and one of real part inf are counted;
    integer targets are not searched."""
    x = torch.complex(torch.randn(16, 3), torch.randn(16, 3))
    x[2, 1] = complex(0.5, float("nan"))
    x[5, 0] = complex(float("inf"), 0.0)
    problem = Problem(torch.nn.Identity(), None, (x, torch.zeros(16, dtype=torch.long)), data={"x_train": x})
    result = data_nonfinite.check(problem)
    assert result.passed is False and result.value == 2 and result.message == "non-finite entries: x_train 2"
    assert result.threshold == "== 0"


def test_nonfinite_targets_are_counted():
    case = CASES["regression_mlp"]()
    data = dict(case.options["data"])
    data["y_test"] = data["y_test"].clone()
    data["y_test"][0] = float("inf")
    result = _report(case, data)["data_nonfinite"]
    assert result.value == 1 and "y_test 1" in result.message
    assert "drop or impute the rows" in result.fix
    data["x_test"], data["y_test"] = data["x_test"][1:], data["y_test"][1:]  # the fix: the row dropped
    fixed = _report(case, data)["data_nonfinite"]
    assert fixed.passed and fixed.value == 0 and fixed.threshold == "== 0"
    assert torch.isfinite(case.options["data"]["y_test"]).all()  # the user's data untouched


def test_a_value_that_rounds_to_minus_zero_is_the_same_as_zero():
    """A test row whose first value is -1e-9 where the training row has 0 (below the rounding: -0.0 after it):
    the same sample."""
    case = CASES["regression_mlp"]()
    train = np.random.default_rng(0).standard_normal((20, 3))
    train[5, 0] = 0.0
    test = np.concatenate([train[5:6] + np.array([-1e-9, 0.0, 0.0]), 5 + train[:4]])
    result = _report(case, {"x_train": train, "x_test": test})["data_duplicates"]
    assert result.value == 1 and "test indices [0]" in result.message, result.message


@pytest.mark.parametrize("shape", [(6,), (2, 3)], ids=["tokens", "grid"])
def test_integer_samples_are_compared_whole(shape):
    """Integer samples (token ids, a grid of category codes): a test sample equal to a training sample in every
    entry is a duplicate; one that differs in its last entry is not."""
    case = CASES["regression_mlp"]()
    train = np.random.default_rng(1).integers(0, 50, (30, *shape))
    near = train[7].copy()
    near.reshape(-1)[-1] += 100
    test = np.stack([train[3], near, train[12]])
    result = _report(case, {"x_train": train, "x_test": test})["data_duplicates"]
    assert result.value == 2 and "test indices [0, 2]" in result.message, result.message


def test_a_constant_training_split_is_rounded_in_absolute_units():
    """A training split of ones (std 0: rounded to 4 decimals as they are): a test row of ones is a duplicate;
    rows of 2 and of 1.00008 (1.0001 to 4 decimals) are not."""
    case = CASES["regression_mlp"]()
    train = np.ones((10, 3))
    test = np.array([[2.0, 2.0, 2.0], [1.00008, 1.0, 1.0], [1.0, 1.0, 1.0]])
    result = _report(case, {"x_train": train, "x_test": test})["data_duplicates"]
    assert result.value == 1 and result.threshold == "== 0", result
    assert result.message == ("1 of 3 test samples (33.3%) also occur in the training split (test indices [2]); 9 "
                              "repeated rows within the training split")
    clean = _report(case, {"x_train": train, "x_test": test[:2]})["data_duplicates"]
    assert clean.passed and clean.threshold == "== 0" and clean.fix == ""


@pytest.mark.parametrize("copies, listed", [(5, "[0, 1, 2, 3, 4])"), (6, "[0, 1, 2, 3, 4] ...)")])
def test_five_duplicates_are_listed_six_elided(copies, listed):
    case = CASES["regression_mlp"]()
    train = np.random.default_rng(2).standard_normal((20, 3))
    test = np.concatenate([train[:copies], 9 + train[:2]])
    result = _report(case, {"x_train": train, "x_test": test})["data_duplicates"]
    assert result.message == (f"{copies} of {copies + 2} test samples ({copies / (copies + 2):.1%}) also occur in the "
                              f"training split (test indices {listed}"), result.message
    assert result.fix == "deduplicate before splitting, or drop these samples from the test split"
    assert result.passed is False and result.threshold == "== 0"


def test_normalization_without_inputs_in_the_data_is_skipped_naming_them():
    case = CASES["digits_mlp"]()
    result = _report(case, {"y_train": case.options["data"]["y_train"]})["data_normalization"]
    assert (result.name, result.status) == ("data_normalization", "skipped")
    assert result.message == "needs data={'x_train': ...} or a batch"


def test_a_test_split_with_its_own_problem_is_named_with_its_statistics():
    """A test split scaled like the training split as a whole (mean 0, std about 1) whose third feature has 170
    times the median std of the others: named as the test split's own problem, with its mean and std; a passing
    result has no fix."""
    signs = np.tile([1.0, -1.0], 10)[:, None]
    train = np.hstack([signs, signs, signs])
    test = np.hstack([0.01 * signs, 0.01 * signs, 1.7 * signs])
    passed = _report(CASES["regression_mlp"](), {"x_train": train})["data_normalization"]
    assert passed.passed and passed.fix == "" and passed.message == "x_train: mean 0, std 1"
    assert passed.threshold == "|mean|<=1, 0.2<=std<=5"
    result = _report(CASES["regression_mlp"](), {"x_train": train, "x_test": test})["data_normalization"]
    assert result.passed is False
    assert result.message == ("x_train: mean 0, std 1; x_test: feature 2 has 170x the median feature std "
                              "(mean 0, std 0.982)"), result.message
    assert result.fix == "normalise the test split with the training split's statistics, exactly as the training split"


@pytest.mark.parametrize("test_values", [[-1.0, 3.0], [-1.0, 1.0], [-4.0, 4.0]], ids=["mean", "half_std", "twice_std"])
def test_the_agreement_bounds_are_included(test_values):
    """A training split of mean 0 and std 2; a test split whose mean is exactly half a training std away (1), or
    whose std is exactly half (1) or twice (4) the training std (all exact in float64): they agree."""
    train = np.array([[-2.0, 2.0], [2.0, -2.0]])
    test = np.array([test_values, test_values[::-1]])
    result = _report(CASES["regression_mlp"](), {"x_train": train, "x_test": test})["data_normalization"]
    assert result.passed, result.message


def test_imbalance_skips_regression_counts_a_single_label_and_says_when_there_are_none():
    """A class with one label of 51 gives a ratio of 50 (not infinite); an empty ``y_train`` is inconclusive (it made
    the check raise); a regression is skipped, naming its task."""
    y_train = torch.cat([torch.zeros(50, dtype=torch.long), torch.ones(1, dtype=torch.long)])
    problem = Problem(torch.nn.Identity(), None, (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)),
                      data={"y_train": y_train})
    result = data_imbalance.check(problem)
    assert result.value == 50.0 and result.threshold == "<= 10", result
    empty = data_imbalance.check(Problem(torch.nn.Identity(), None, (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)),
                                         data={"y_train": torch.zeros(0, dtype=torch.long)}))
    assert empty.status == "inconclusive" and empty.message == "inconclusive: data['y_train'] holds no labels"
    regression = data_imbalance.check(Problem(torch.nn.Identity(), None, (torch.zeros(2, 2), torch.zeros(2, 2)),
                                              task="regression"))
    assert regression.status == "skipped" and regression.message == "task 'regression': no class balance to check"


def test_an_imbalance_of_exactly_ten_to_one_passes():
    y_train = torch.cat([torch.zeros(50, dtype=torch.long), torch.ones(5, dtype=torch.long)])
    problem = Problem(torch.nn.Identity(), None, (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)),
                      data={"y_train": y_train})
    result = data_imbalance.check(problem)
    assert result.passed and result.value == 10.0, result


@pytest.mark.parametrize("test_labels, status", [([0] * 50 + [1] * 50, "failed"), ([0, 0, 0, 1], "inconclusive")])
def test_a_skewed_split_and_a_test_split_too_small_to_tell_are_said_in_full(test_labels, status):
    """100 labels of class 0 and 5 of class 1 (ratio 20): against a 50/50 test split the training split is
    skewed (95 % against 50 %); against 4 test labels (75 %) three standard errors exceed the resolution."""
    y_train = torch.cat([torch.zeros(100, dtype=torch.long), torch.ones(5, dtype=torch.long)])
    problem = Problem(torch.nn.Identity(), None, (torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)),
                      data={"y_train": y_train, "y_test": torch.tensor(test_labels)})
    result = data_imbalance.check(problem)
    counted = "class 0 has 100 samples, class 1 5 (2 classes, 105 labels); class 0 is 95% of the training labels and "
    assert (result.name, result.status, result.value, result.threshold) == ("data_imbalance", status, 20.0, "<= 10")
    if status == "failed":
        assert result.message == counted + "50% of 100 test labels: the training split is skewed"
        assert result.fix == ("the split or a subsampling skewed the training labels: split with stratification (the "
                              "same class shares in both splits) and check the filtering of the training split")
    else:
        assert result.message == ("inconclusive: " + counted + "75% of 4 test labels, too few test labels to tell a "
                                  "skewed split")
        assert result.fix == data_imbalance.TO_PASS


def test_nonfinite_values_are_sought_in_the_data_and_else_in_the_batch_targets_too():
    """With ``data=``: "in data" and its splits; without: the batch, its targets included (a NaN target)."""
    x, y = torch.randn(8, 3), torch.randn(8)
    clean = data_nonfinite.check(Problem(torch.nn.Identity(), None, (x, y), task="regression",
                                         data={"x_train": x, "y_train": y}))
    assert clean.message == "all entries finite in data (x_train, y_train)"
    y[3] = float("nan")
    batch = data_nonfinite.check(Problem(torch.nn.Identity(), None, (x, y), task="regression"))
    assert batch.value == 1 and batch.message == "non-finite entries: y (batch) 1"
