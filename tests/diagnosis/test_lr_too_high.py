"""``lr_too_high`` on a non-finite loss whose parameters are non-finite: a diverged update only
after a finite loss was seen."""

import math

import pytest

from cockpit_lite.diagnosis.history import History
from cockpit_lite.diagnosis.rules.lr_too_high import SUGGESTION, LrTooHigh

ORIGIN = {"module": "0", "op": "AddmmBackward0", "params_nonfinite": True}


def _findings(entries):
    history, rule, found = History(), LrTooHigh(), []
    for step, entry in entries:
        history.update(step, entry)
        found += rule.observe(step, entry, history)
    return found


def test_non_finite_parameters_after_a_finite_loss_are_a_diverged_update():
    found = _findings([(0, {"Loss": 2.3}), (1, {"Loss": math.nan, "NonfiniteOrigin": ORIGIN})])
    assert [(f.kind, f.step) for f in found] == [("lr_too_high", 1)]
    assert "an update diverged" in found[0].message
    # no update size was logged: no divisor to name, the general suggestion (3-10x)
    assert found[0].suggestion == SUGGESTION and "lr_divisor" not in found[0].evidence


def test_non_finite_parameters_at_the_first_loss_seen_are_not_blamed_on_the_learning_rate():
    # tracking began at step 3 (a budget's untracked first steps): non-finite data at step 0
    # may have written NaN into the parameters; nothing says an update diverged
    assert _findings([(3, {"Loss": math.nan, "NonfiniteOrigin": ORIGIN}), (6, {"Loss": math.nan})]) == []


def noisy_run(held_out, key="test_loss"):
    """A regression whose mini-batch loss swings by batch (outlier targets in some batches) while
    ``held_out(step)`` is logged every 5 steps (as ``key``, the other held-out key ``None``)."""
    entries = []
    for step in range(60):
        outlier = step >= 6 and step % 6 in (0, 1, 2)
        entry = {"Loss": (1.0, 1.1, 0.9)[step] if step < 3 else (1.4 if outlier else 0.06 + 0.3 / (1 + step))}
        if step % 5 == 0:
            entry.update({"train_loss": None, "valid_loss": None, "test_loss": None, key: held_out(step)})
        entries.append((step, entry))
    return entries


@pytest.mark.parametrize("key", ["test_loss", "valid_loss"])
def test_a_noisy_loss_whose_held_out_loss_falls_is_no_collapse(key):
    assert _findings(noisy_run(lambda s: 1.0 / (1 + 0.1 * s), key)) == []


def test_a_collapse_the_held_out_loss_confirms_is_found():
    found = _findings(noisy_run(lambda s: 1.0 / (1 + 0.1 * s) if s < 30 else 0.9))
    assert found and {f.kind for f in found} == {"lr_too_high"} and "held-out loss" in found[0].message


def test_a_collapse_needs_the_held_out_loss_back_more_than_60_percent_of_the_way():
    """The held-out loss 1 at first, 0.375 at best, then back to 0.75: exactly 0.375 + 0.6 (1 - 0.375), not
    more (all exact in binary): no collapse; back to 0.9: a collapse, quoting first -> best -> last."""
    def held(last):
        return lambda s: 1.0 if s == 0 else 0.375 if s < 30 else last
    assert _findings(noisy_run(held(0.75))) == []
    found = _findings(noisy_run(held(0.9)))
    assert found and "the held-out loss went 1 -> 0.375 -> 0.9" in found[0].message, found
    assert found[0].evidence["loss_ref"] == 1.0  # L0: the median of the first losses 1, 1.1 and 0.9


def overshoot(losses, update=0.3):
    return _findings([(s, {"Loss": loss, "ParamNorm": [10.0, 1.0], "UpdateSize": [10.0 * update, update]})
                      for s, loss in enumerate(losses)])


def test_overshooting_steps_while_the_loss_rises_are_lr_too_high():
    # AdamW at a high learning rate without warm-up: the loss jumps, then plateaus (no 2x divergence)
    found = overshoot([4.55, 3.68, 4.98, 5.43, 4.02, 4.09, 4.33])
    assert found and "overshoot" in found[0].message


def test_large_steps_on_a_falling_loss_or_ordinary_steps_on_a_noisy_loss_are_not():
    assert overshoot([2.3, 2.2, 2.1, 1.9, 1.7, 1.5, 1.3]) == []
    assert overshoot([4.55, 3.68, 4.98, 5.43, 4.02, 4.09, 4.33], update=0.02) == []


def heavy_tailed(update, held=None):
    """A Huber regression whose first batches were lucky: the 7-record median loss is 2.3x L0 (outlier batches
    swing the loss 0.24 - 3.5), with updates of ``update`` of the weights' norm; ``held``: {step: valid_loss}."""
    losses = [0.297, 3.46, 0.241, 0.824, 0.679, 0.845, 0.263, 0.7, 0.75, 0.8]
    return _findings([(s, {"Loss": loss, "ParamNorm": [10.0, 1.0], "UpdateSize": [10.0 * update, update],
                           **({"valid_loss": held[s]} if held and s in held else {})})
                      for s, loss in enumerate(losses)])


def test_a_loss_above_twice_its_start_after_small_updates_is_not_a_divergence():
    assert heavy_tailed(0.015) == []


def test_the_same_losses_after_large_updates_are():
    found = heavy_tailed(0.1)  # the rule itself, without the Diagnosis' once-per-kind: a finding per record
    assert found and found[0].step == 6 and "rose from" in found[0].message
    # L0 = median(0.297, 3.46, 0.241); the 7 records' median 0.679 = 2.29 L0
    assert found[0].evidence == {"loss_ref": 0.297, "loss": 0.679, "ratio": round(0.679 / 0.297, 3),
                                 "lr_divisor": 3.3}
    assert "2.3x its initial value" in found[0].message


def test_updates_of_half_the_weights_on_a_flat_loss_are_found_from_the_third_update_on():
    """The first record has no update; updates of 0.6 of the weights' norm at steps 1-3 on a loss flat at 2.3:
    found at step 3 (the median of 3 updates), naming step 1."""
    moves = {"ParamNorm": [10.0, 1.0], "UpdateSize": [6.0, 0.6]}
    found = _findings([(0, {"Loss": 2.3})] + [(s, {"Loss": 2.3, **moves}) for s in (1, 2, 3)])
    assert len(found) == 1 and found[0].step == 1 and found[0].evidence["update_ratio"] == 0.6


def test_losses_that_the_first_updates_already_raised_do_not_raise_the_start():
    """Adam at 1.0 on a small held-out net (PReLU, Bilinear, RMSNorm): updates of 3.4, 0.7, 0.4 of the weights'
    norm, the loss 1.07 -> 2.36 -> 2.34. L0, the median of the first 3 losses, is 2.34 itself, so neither the
    overshoot (3-median ≥ 1.05 L0) nor the flat loss (≥ 0.9 L0) held and nothing was found; against the first
    loss both do: found at step 2."""
    ratios = [3.38, 0.70, 0.41, 0.28, 0.20, 0.15, 0.12]
    losses = [1.07, 2.36, 2.34, 1.58, 1.37, 1.18, 1.83]
    found = _findings([(s, {"Loss": loss, "ParamNorm": [10.0, 1.0], "UpdateSize": [10.0 * r, r]})
                       for s, (loss, r) in enumerate(zip(losses, ratios))])
    assert found and found[0].step == 2 and "overshoot" in found[0].message
    assert "the loss rose from 1.07 to 2.34" in found[0].message and found[0].evidence["loss_ref"] == 1.07


def test_a_divergence_is_measured_from_the_first_loss_when_the_first_updates_raised_the_next():
    """timm's EfficientNet-B0 under SGD at 0.05 with momentum 0.9 (5 of 5 seeds diverge this way): updates of
    0.11-0.16 of the weights' norm, the loss 6.72 -> 18.3 -> 43.6 -> 58. L0 = 18.3 held the rise, and the
    7-record median 31.3 stayed below 2 L0: nothing was found (the healthy AdamW twin's updates are 0.005)."""
    losses = [6.72, 18.29, 43.58, 43.4, 57.99, 31.33, 19.25, 7.97]
    ratios = [0.111, 0.145, 0.157, 0.146, 0.127, 0.109, 0.093, 0.079]
    found = _findings([(s, {"Loss": loss, "ParamNorm": [10.0, 1.0], "UpdateSize": [10.0 * r, r]})
                       for s, (loss, r) in enumerate(zip(losses, ratios))])
    assert found and found[0].step == 6 and "the loss rose from 6.72 at the start to 31.3" in found[0].message
    assert found[0].evidence["loss_ref"] == 6.72


def test_the_diverged_update_s_message_and_evidence_name_the_module():
    (found,) = _findings([(0, {"Loss": 2.3}), (1, {"Loss": math.nan, "NonfiniteOrigin": ORIGIN})])
    assert found.message == ("the loss became non-finite at step 1 because the parameters of '0' were already "
                             "non-finite: an update diverged")
    assert found.evidence == {"loss_ref": 2.3, "module": "0"}


def test_non_finite_parameters_on_the_first_record_are_no_diverged_update():
    """The first record's loss is finite but its parameters are not: no update was seen before it."""
    assert _findings([(0, {"Loss": 2.3, "NonfiniteOrigin": ORIGIN})]) == []


def _moves(ratios, last=None):
    """Records of a loss flat at 2.3 (step 0 without an update), then updates of ``ratios`` of the weights' norm
    (||θ|| = 1); ``last``: one more record (step len(ratios) + 1)."""
    entries = [(0, {"Loss": 2.3})] + [(s + 1, {"Loss": 2.3, "ParamNorm": [1.0], "UpdateSize": [r]})
                                      for s, r in enumerate(ratios)]
    return _findings(entries + ([(len(ratios) + 1, last)] if last else []))


def test_the_update_size_is_the_median_of_the_last_3_updates():
    """Updates 0.1, 0.1, 0.6, 0.6: at step 4 the last 3 give 0.6 (the last 4 would give 0.35): found, naming step 2."""
    assert [(f.step, f.evidence["update_ratio"]) for f in _moves([0.1, 0.1, 0.6, 0.6])] == [(2, 0.6)]


def test_the_suggestion_quotes_the_update_size_and_how_far_to_lower_the_rate():
    """Updates of 0.637: 0.637 / 0.03 = 21x the healthy step."""
    (found,) = _moves([0.637] * 3)
    assert found.message == ("each update changes the weights by 0.64 of their norm (median of the 3 steps up to 3; "
                             "healthy: ~1e-3 to 1e-2)")
    assert found.suggestion == ("lower the learning rate by ~21x (updates of 0.64 of the weights' norm per step; "
                                "healthy runs take <= 0.03), add warm-up, or clip the gradient norm")
    assert found.evidence == {"update_ratio": 0.637, "loss_ref": 2.3, "lr_divisor": 21.0}


def test_updates_of_exactly_the_healthy_size_name_no_factor():
    """Updates of exactly 0.03 (the healthy step's bound), then a diverged update: the general suggestion."""
    (found,) = _moves([0.03] * 3, last={"Loss": math.nan, "NonfiniteOrigin": ORIGIN})
    assert found.suggestion == SUGGESTION and "lr_divisor" not in found.evidence


def _stuck(losses):
    """Updates of 0.6 of the weights' norm at steps 3-5 only, on ``losses`` at steps 0-5 (L0 = 2: the median of the
    first 3)."""
    moves = {"ParamNorm": [1.0], "UpdateSize": [0.6]}
    return [f.step for f in _findings([(s, {"Loss": loss, **(moves if s >= 3 else {})})
                                       for s, loss in enumerate(losses)])]


def test_large_updates_are_found_while_the_median_of_the_last_3_losses_stays_at_or_above_0_9_l0():
    # at step 5 the last 3 losses' median is 1.8, exactly 0.9 L0 (doubling 0.9 is exact): not improving
    assert _stuck([2.0, 2.0, 2.0, 1.8, 1.8, 1.8]) == [3]
    # 1.0: the loss improves, the large updates are not lr_too_high
    assert _stuck([2.0, 2.0, 2.0, 1.0, 1.0, 1.0]) == []
    # the last 3 losses 1.0, 1.8, 2.0 (median 1.8); with step 2's 1.0 the last 4 would give 1.4
    assert _stuck([2.0, 2.0, 1.0, 1.0, 1.8, 2.0]) == [3]


def test_updates_of_exactly_half_the_weights_are_found():
    assert [(f.step, f.evidence["update_ratio"]) for f in _moves([0.5] * 3)] == [(1, 0.5)]


def _overshoot(ratios, losses):
    """Records of ``losses`` (step 0 without an update), then updates of ``ratios`` (||θ|| = 1)."""
    return _findings([(0, {"Loss": losses[0]})] + [(s + 1, {"Loss": loss, "ParamNorm": [1.0], "UpdateSize": [r]})
                                                   for s, (r, loss) in enumerate(zip(ratios, losses[1:]))])


def test_the_overshoot_quotes_the_first_3_step_median_that_reached_the_largest_update():
    """Updates of 0.337 at steps 1-6 (their 3-step median is first 0.337 at step 3), the loss 2 until step 4, then
    2.5: at step 6 the last 3 losses' median 2.5 (the last 4's: 2.25) is above 1.05 L_s (L_s = 2)."""
    (found,) = _overshoot([0.337] * 6, [2.0] * 5 + [2.5, 2.5])
    assert found.step == 6
    assert found.message == ("updates changed the weights by 0.34 of their norm (median of the 3 steps up to 3; "
                             "healthy: ~1e-3 to 1e-2) and the loss rose from 2 to 2.5 (median of the 3 records up to "
                             "step 6): the steps overshoot")
    assert found.evidence == {"update_ratio": 0.337, "loss_ref": 2.0, "loss": 2.5, "lr_divisor": 11.0}


def test_the_largest_update_is_a_3_step_median_kept_for_the_whole_run():
    """Two updates of 0.3 are no 3-step median (nothing found when the loss then rises); three of 0.3, then three
    of 0.01: the largest so far is still 0.3 when the loss rises at step 8."""
    assert _overshoot([0.3, 0.3], [2.0, 2.5, 2.5]) == []
    (found,) = _overshoot([0.3] * 3 + [0.01] * 5, [2.0] * 7 + [2.5, 2.5])
    assert (found.step, found.evidence["update_ratio"]) == (8, 0.3)


def test_the_loss_rose_by_exactly_1_05_l_s_is_an_overshoot_and_two_losses_tell_no_rise():
    """The loss 2, then 2.1 = 1.05 x 2 (doubling 1.05 is exact): the bound, included. Updates of 0.3 on three
    records of which only the first two have a loss (2, then 2.5): no 3-record median of the loss, nothing."""
    assert [f.step for f in _overshoot([0.3] * 6, [2.0] * 5 + [2.1, 2.1])] == [6]
    moves = {"ParamNorm": [1.0], "UpdateSize": [0.3]}
    assert _findings([(0, {"Loss": 2.0}), (1, {"Loss": 2.5, **moves}), (2, moves), (3, moves)]) == []


def test_updates_of_exactly_0_2_of_the_weights_overshoot():
    """Updates of exactly 0.2 (the overshoot's bound, included), the loss 2, then 2.5."""
    assert [f.step for f in _overshoot([0.2] * 6, [2.0] * 5 + [2.5, 2.5])] == [6]


def _spike(losses, ratios):
    """Records of ``losses`` with updates ``ratios`` (``None``: no update logged; ||θ|| = 1); a loss ``None``: none."""
    return _findings([(s, {**({"Loss": loss} if loss is not None else {}),
                           **({"ParamNorm": [1.0], "UpdateSize": [r]} if r is not None else {})})
                      for s, (loss, r) in enumerate(zip(losses, ratios))])


def test_a_spike_is_judged_on_a_record_with_a_loss_after_the_last_3_updates():
    # the first loss 0.5, then 6 (12x) after an update of 0.3: a spike, whatever the first loss's size
    assert [f.step for f in _spike([0.5, 6.0], [None, 0.3])] == [1]
    # 20x after updates of 0.01; the record after it has an update of 0.5 but no loss of its own
    assert _spike([1.0, 1.0, 20.0, None], [None, 0.01, 0.01, 0.5]) == []
    # the update of 0.5 came 4 updates before the spike
    assert _spike([1.0, 1.0, 1.0, 1.0, 20.0], [None, 0.5, 0.01, 0.01, 0.01]) == []
    # no update logged at all, or a first loss of 0: nothing to blame a spike on, nothing to divide by
    assert _spike([1.0, 20.0], [None, None]) == []
    assert _spike([0.0, 1.0], [None, 0.5]) == []


def test_a_spike_is_more_than_10x_the_first_loss_after_an_update_of_at_least_0_2():
    assert _spike([1.0, 10.0], [None, 0.3]) == []  # exactly 10x: not above it
    assert [f.step for f in _spike([1.0, 11.0], [None, 0.2])] == [1]  # an update of exactly 0.2, included
    (found,) = _spike([0.5, 6.37], [None, 0.337])
    assert found.message == ("the loss spiked to 6.37 at step 1, 13x its first value 0.5, after an update of 0.34 of "
                             "the weights' norm")
    assert found.evidence == {"loss_first": 0.5, "loss": 6.37, "ratio": 12.74, "update_ratio": 0.337,
                              "lr_divisor": 11.0}


def test_a_held_out_loss_below_its_first_log_says_the_rising_mini_batch_losses_are_no_divergence():
    """The losses of the test above after large updates, with a held-out loss logged at steps 0 and 5: 1 then 0.9
    (below its first log, at its best): no divergence; 1 then 1 (not below): a divergence, from step 6."""
    assert heavy_tailed(0.1, {0: 1.0, 5: 0.9}) == []
    assert heavy_tailed(0.1, {0: 1.0, 5: 1.0})[0].step == 6


@pytest.mark.parametrize("losses", [[-1.0] * 10, [0.0] * 3 + [1.0] * 7])
def test_no_divergence_or_collapse_is_measured_from_an_l0_at_or_below_0(losses):
    """A negative loss (a Gaussian NLL) or one starting at exactly 0, after updates of 0.1: no factor over L0."""
    assert _spike(losses, [None] + [0.1] * 9) == []


def test_the_bounds_of_a_divergence_and_a_collapse():
    """L0 = 1. A 7-record median of exactly 2 L0 after updates of 0.1 is no divergence, 2.01 is (from step 6, the
    first 7 records); 3 L0 after updates of exactly 0.05 (DIVERGE_RATIO, included) is. A loss level down to exactly
    0.7 L0 (1 - LEARNED, exact in binary) has not learned, so its way back to 1 is no collapse; down to 0.69, it is
    (named at step 13, where the level is back)."""
    after = [None] + [0.1] * 9
    assert _spike([1.0] * 3 + [2.0] * 7, after) == []
    assert [f.step for f in _spike([1.0] * 3 + [2.01] * 7, after)][:1] == [6]  # (the rule alone: one per record)
    assert [f.step for f in _spike([1.0] * 3 + [3.0] * 7, [None] + [0.05] * 9)][:1] == [6]
    assert _spike([1.0] * 3 + [0.7] * 7 + [1.0] * 7, [None] * 17) == []
    assert [f.step for f in _spike([1.0] * 3 + [0.69] * 7 + [1.0] * 7, [None] * 17)][:1] == [13]


def test_a_loss_level_back_exactly_60_percent_of_the_way_is_no_collapse():
    """L0 = 1, the level down to 0.5, then back to 0.8 = 0.5 + 0.6 (1 - 0.5) exactly: not more than 60 % of the way
    back; 0.81 is."""
    assert _spike([1.0] * 3 + [0.5] * 7 + [0.8] * 7, [None] * 17) == []
    assert [f.step for f in _spike([1.0] * 3 + [0.5] * 7 + [0.81] * 7, [None] * 17)][:1] == [13]


@pytest.mark.parametrize("first, best, last, found", [
    (2.0, 0.75, 1.8, True),   # the held-out loss learned (0.75 < 0.7 x 2) and came back more than 60 % of the way
    (1.0, 0.8, 1.0, False),   # it never learned: 0.8 is not below 0.7 x 1
    (1.0, 0.7, 1.0, False),   # exactly 0.7 x 1 (1 - LEARNED, exact in binary): not below
])
def test_a_collapse_needs_a_held_out_loss_that_had_learned(first, best, last, found):
    held = _findings(noisy_run(lambda s: first if s == 0 else best if s < 30 else last))
    assert bool(held) == found, held


def test_the_collapse_message_quotes_the_level_where_it_came_back_and_where_it_is_confirmed():
    """L0 = 1, the level down to 0.69, then losses 0.9, 0.95, ..., 1.2: the 7-record level is 0.9 at step 13 (above
    0.69 + 0.6 (1 - 0.69) = 0.876), 1 at step 15, the third record back."""
    (found, *_) = _spike([1.0] * 3 + [0.69] * 7 + [0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2], [None] * 17)
    assert found.step == 13
    assert found.message == ("the loss fell from 1 to 0.69 (medians of 7 records), then climbed back to 0.9 by step 13 "
                             "(1 at step 15): training collapsed")
    assert found.evidence == {"loss_ref": 1.0, "best": 0.69, "loss": 1.0}
