"""``History``: the update ratio ‖Δθ‖/‖θ‖ leaves out records between which no optimizer step came (nothing
moved at a positive learning rate: a micro-batch of gradient accumulation); a rate of 0 moves nothing on
purpose and counts."""

from cockpit_lite.diagnosis.history import History


def ratios(lr, updates):
    history = History(["w"], [(4, 4)])
    for step, update in enumerate(updates):
        entry = {"ParamNorm": [10.0], "UpdateSize": [update]}
        if lr is not None:
            entry["GradPresence"] = {"lr": lr}
        history.update(step, entry)
    return [r for _, r in history.ratios]


def test_a_record_without_an_optimizer_step_is_no_update_ratio():
    assert ratios(0.1, [0.0, 0.1, 0.0, 0.2]) == [0.01, 0.02]


def test_a_zero_learning_rate_or_an_unknown_one_counts():
    assert ratios(0.0, [0.0, 0.0]) == [0.0, 0.0]
    assert ratios(None, [0.0, 0.1]) == [0.0, 0.01]


def test_loss_ref_is_the_median_of_the_first_three_finite_losses_at_every_record_and_after_a_load():
    """Kept as found (no rescan of the run per record): equal, record by record, to the median recomputed
    from the whole list, and recomputed when a loaded state brings another list."""
    import math
    import statistics

    losses = [math.nan, 3.0, math.inf, 1.0, math.nan, 2.0, 5.0, 0.5]
    history = History()
    for step, loss in enumerate(losses):
        history.update(step, {"Loss": loss})
        finite = [(s, v) for s, v in enumerate(losses[:step + 1]) if math.isfinite(v)]
        expected = statistics.median(v for _, v in finite[:3]) if finite else math.nan
        assert (math.isnan(history.loss_ref) and math.isnan(expected)) or history.loss_ref == expected
        assert history.first_finite_loss == (finite[0] if finite else None)
    history.losses = [(10, 7.0), (11, 9.0)]  # what Diagnosis.load_state_dict does
    assert history.loss_ref == 8.0 and history.first_finite_loss == (10, 7.0)
