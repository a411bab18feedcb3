"""``InputStats`` against numpy on the first ``SUB_BATCH`` samples, with and without non-finite entries."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import InputStats
from cockpit_lite.quantities.input_stats import KEYS, SUB_BATCH, _combined, _per_sample


def run(x):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2))
    cp = Cockpit(model, [InputStats()], diagnose=False)
    loss = torch.nan_to_num(model(x)).square().mean()  # the model sees x; the loss stays finite
    with cp(0, info={"loss": loss}):
        loss.backward()
    return cp.output[0]["InputStats"]


@pytest.mark.parametrize("nan", [False, True])
def test_against_numpy(nan):
    torch.manual_seed(0)
    x = 50 + 20 * torch.randn(40, 3, 4)
    if nan:
        x[1, 0, 0], x[3, 2, 1], x[30, 0, 0] = float("nan"), float("inf"), float("nan")  # [30] outside the sub-batch
    stats = run(x)
    sub = x[:SUB_BATCH].double().numpy().reshape(-1)
    good = sub[np.isfinite(sub)]
    assert stats["mean"] == pytest.approx(good.mean(), rel=1e-5)
    assert stats["std"] == pytest.approx(good.std(ddof=1), rel=1e-4)
    assert stats["min"] == pytest.approx(good.min()) and stats["max"] == pytest.approx(good.max())
    assert stats["nonfinite"] == pytest.approx(np.mean(~np.isfinite(sub)), rel=1e-5)


def test_the_spread_of_inputs_far_from_zero():
    """Unnormalised inputs, mean 10⁴ and std 10⁻²: ``Σx² − n·mean²`` cancels 10 of its 16 digits (float32
    would have none left)."""
    torch.manual_seed(1)
    x = 1e4 + 1e-2 * torch.randn(40, 3, 4, dtype=torch.float64)
    assert_matches(run(x.float()), x.float())


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("mean, std", [(1.7e9, 1.0), (1.7e12, 1e3), (-1e8, 1e-3)])
def test_the_spread_of_float64_inputs_far_from_zero(mean, std, nonfinite):
    """Raw float64 features (unix timestamps in s or ms): ``Σx² − n·mean²`` had no digit left (the std came
    out 0 in one process, 18.5 instead of 0.99 from the ranks' rows); two passes, against numpy's, in one
    process and from the rows of two ranks (7 and 33 samples), with a non-finite entry too. The ranks'
    rows carry each sample's mean, rounded at ``|mean|·2⁻⁵³``, into the spread between the samples: at
    |mean|/std = 1e11 that is 1.1e-6 relative on seeds 0-4 (one process: 2.3e-11), hence 1e-5 there."""
    x = mean + std * torch.randn(40, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    if nonfinite:
        x[2, 1, 0] = math.nan
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2)).double()
    stats = steps(model, InputStats(), [x], forward=lambda m, b: torch.nan_to_num(m(b) - m(b).detach()))[0]
    ranks = dict(zip(KEYS, _combined([_per_sample(x[:7]), _per_sample(x[7:])])))
    for found, rtol in (stats["InputStats"], 1e-9), ({k: v.item() for k, v in ranks.items()}, 1e-5):
        assert found["std"] == pytest.approx(reference(x)["std"], rel=rtol)
        assert_matches(found, x)


def test_a_batch_passed_by_keyword_is_read():
    """``model(x=batch)`` (Hugging Face's ``inputs_embeds=``): the hook sees the keyword arguments too."""

    class Keyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(12, 2)

        def forward(self, mask=None, x=None):
            return self.lin(x.flatten(1))

    torch.manual_seed(2)
    x = 3 + 2 * torch.randn(20, 3, 4)
    model = Keyword()
    cp = Cockpit(model, [InputStats()], diagnose=False)
    loss = model(x=x).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert_matches(cp.output[0]["InputStats"], x)


def test_integer_inputs_are_not_recorded():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 1))
    cp = Cockpit(model, [InputStats()], diagnose=False)
    loss = model(torch.randint(0, 10, (5, 3))).square().mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert "InputStats" not in cp.output.get(0, {})


class Counted(nn.Module):
    """Called as the Hugging Face ``Trainer`` calls a model under DDP: a 0-d float tensor
    ``num_items_in_batch`` (the loss's divisor) among the keyword arguments, before the batch."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)

    def forward(self, num_items_in_batch=None, x=None):
        return self.net(x).square().sum() / num_items_in_batch


def test_a_0d_float_beside_the_batch_is_not_the_input():
    """The batch after it is read. Before, the count was taken for the input: one entry, nothing recorded in
    one process; under DDP (one entry suffices there, the ranks' add up) mean 64, std 0, and the diagnosis
    warned that the inputs were not normalised (``test_ddp_under_torchrun_records_what_one_process_records``
    in tests/integrations/test_huggingface.py)."""
    model = Counted()
    cp = Cockpit(model, [InputStats()], diagnose=False)
    x = 3 + 2 * torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    loss = model(num_items_in_batch=torch.tensor(15.0), x=x)
    with cp(0, info={"loss": loss}):
        loss.backward()
    assert_matches(cp.output[0]["InputStats"], x)


def reference(x):
    """The statistics by numpy: a batched input (2-d or more) by its first ``SUB_BATCH`` samples,
    a 1-d one (one unbatched sample) by all its entries."""
    sub = (x[:SUB_BATCH] if x.dim() > 1 else x).double().numpy().reshape(-1)
    good = sub[np.isfinite(sub)]
    n = len(good)  # (without a finite entry NaN; std NaN with one)
    return {"mean": good.sum() / n if n else np.nan, "std": good.std(ddof=1) if n > 1 else np.nan,
            "min": good.min() if n else np.nan, "max": good.max() if n else np.nan,
            "nonfinite": np.mean(~np.isfinite(sub))}


def assert_matches(stats, x):
    ref = reference(x)
    assert set(stats) == set(ref)
    for key, value in ref.items():
        assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), key


def steps(model, quantity, batches, forward=None):
    """Train steps on ``batches`` (one per step); the record and what was printed."""
    cp = Cockpit(model, [quantity], diagnose=False)
    for step, x in enumerate(batches):
        loss = (forward(model, x) if forward else model(x)).square().mean()
        with cp(step, info={"loss": loss}):
            loss.backward()
    cp.close()
    return cp.output


def batches(n, *shape):
    gen = torch.Generator().manual_seed(3)
    return [k + (k + 1) * torch.randn(*shape, generator=gen) for k in range(n)]


def test_the_schedule_is_followed():
    """Due at 0, 2 and 3 only: each due step records the statistics of its own batch."""
    xs = batches(5, 20, 12)
    output = steps(nn.Linear(12, 2), InputStats(track_schedule=lambda s: s in (0, 2, 3)), xs)
    recorded = {step: entry["InputStats"] for step, entry in output.items() if "InputStats" in entry}
    assert sorted(recorded) == [0, 2, 3]
    for step, stats in recorded.items():
        assert_matches(stats, xs[step])


def test_verbose_prints_each_value(capsys):
    xs = batches(1, 4, 12)
    steps(nn.Linear(12, 2), InputStats(), xs)
    assert capsys.readouterr().out == ""
    steps(nn.Linear(12, 2), InputStats(verbose=True), xs)
    assert "InputStats" in capsys.readouterr().out


def test_a_cockpit_without_a_model_records_nothing_and_closes():
    model = nn.Linear(12, 2)
    output = steps(model.parameters(), InputStats(), batches(1, 4, 12), forward=lambda _, x: model(x))
    assert "InputStats" not in output.get(0, {})


def test_close_removes_the_hook():
    model = nn.Linear(12, 2)
    cp = Cockpit(model, [InputStats()], diagnose=False)
    assert model._forward_pre_hooks
    cp.close()
    assert not model._forward_pre_hooks


def test_the_first_forward_with_gradients_is_read():
    """An evaluation forward (no gradients) before, and a second forward after, are ignored."""
    first, evaluation, second = batches(3, 6, 12)

    def forward(model, x):
        with torch.no_grad():
            model(evaluation)
        return model(x) + model(second)

    output = steps(nn.Linear(12, 2), InputStats(), [first], forward=forward)
    assert_matches(output[0]["InputStats"], first)


def test_two_entries_are_enough_one_is_not():
    """In one process, and from the ranks' rows: two ranks of one entry each are two entries (each rank
    records its entry), one entry in all is none."""
    x = torch.tensor([[1.5], [-2.0]])
    output = steps(nn.Linear(1, 1), InputStats(), [x, x[:1]])
    assert_matches(output[0]["InputStats"], x)
    assert output[0]["InputStats"]["std"] == pytest.approx(3.5 / math.sqrt(2))
    assert "InputStats" not in output.get(1, {})
    stats = dict(zip(KEYS, _combined([_per_sample(x[:1]), _per_sample(x[1:])])))
    assert_matches({k: v.item() for k, v in stats.items()}, x)
    assert _combined([_per_sample(x[:1])]) is None and _combined([_per_sample(x[0, 0:1])]) is None


@pytest.mark.parametrize("shape", [(40,), (40, 12)])
def test_an_unbatched_input_counts_all_its_entries_a_batched_one_its_first_samples(shape):
    x = batches(1, *shape)[0] + torch.linspace(0, 30, shape[0]).reshape(-1, *[1] * (len(shape) - 1))
    stats = steps(nn.Linear(shape[-1], 2), InputStats(), [x])[0]["InputStats"]
    assert_matches(stats, x)
    if len(shape) == 1:
        assert stats["max"] == pytest.approx(x.max().item())  # a late entry: the whole vector is read
    else:
        assert stats["max"] < x[SUB_BATCH:].max().item()


@pytest.mark.parametrize("shape", [(20, 3), (30,)])
def test_the_ranks_rows_give_the_whole_batchs_statistics(shape):
    """FSDP2's reduction (each rank's ``_per_sample`` rows, then ``_combined`` in rank order) against numpy
    on the whole batch: two ranks holding 13 and 7 samples (the first ``SUB_BATCH`` samples cross the ranks'
    boundary; of a 1-d input, every entry), with non-finite entries on both ranks."""
    x = 50 + 20 * torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    x[1], x[14], x[-1] = math.nan, math.inf, -math.inf  # the last outside the sub-batch of a batched input
    stats = dict(zip(KEYS, _combined([_per_sample(x[:13]), _per_sample(x[13:])])))
    assert_matches({k: v.item() for k, v in stats.items()}, x)


def test_the_ranks_rows_of_float64_entries_beyond_float32s_range():
    """The rows' minimum and maximum leave the non-finite entries out as the input dtype's largest number:
    float64 entries of 1e100 (beyond float32's 3.4e38) beside a NaN keep their extremes."""
    x = 1e100 * (2 + torch.rand(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    x[0, 1] = x[3, 2] = math.nan
    stats = dict(zip(KEYS, _combined([_per_sample(x[:2]), _per_sample(x[2:])])))
    assert_matches({k: v.item() for k, v in stats.items()}, x)


@pytest.mark.parametrize("finite", [0, 1, 2])
def test_inputs_with_fewer_than_two_finite_entries(finite):
    """Of 3 × 4 entries only ``finite`` are finite (4.0 and 4.5): no finite entry gives NaN statistics (not a
    mean of 0 and the reductions' sentinels ±3.4e38 as extremes), one gives its value and a NaN std, two
    their mean and Bessel-corrected std (0.5 / √2: a variance below 1), in one process and from the ranks'
    rows (5 and 7 entries of a 1-d input; 1 and 2 samples; one rank holding one sample)."""
    x = torch.full((12,), math.nan)
    x[[7, 2][:finite]] = torch.tensor([4.0, 4.5])[:finite]
    x = x.reshape(3, 4)
    assert_matches(steps(nn.Linear(4, 2), InputStats(), [x], forward=lambda m, b: torch.nan_to_num(m(b)))[0]["InputStats"], x)
    flat = x.reshape(-1)
    for parts in ([flat[:5], flat[5:]], [x[:1], x[1:]], [x[:1]]):
        whole = torch.cat(parts)
        stats = dict(zip(KEYS, _combined([_per_sample(part) for part in parts])))
        assert_matches({k: v.item() for k, v in stats.items()}, whole)
    if finite == 2:
        assert reference(x)["std"] == pytest.approx(0.5 / math.sqrt(2))


def test_the_ranks_rows_are_made_on_the_inputs_device():
    """``_per_sample`` of an input on another device (``meta`` stands in for a GPU) makes its rows there."""
    rows = _per_sample(torch.empty(20, 3, device="meta"))
    assert rows.device.type == "meta" and rows.shape == (SUB_BATCH, 7)
