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
