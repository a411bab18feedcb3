"""``overfitting``: a transient rise of the held-out loss on a healthy run is not overfitting; a sustained
rise while the training loss falls far below it is found a few logs after it begins; one noisy
evaluation never decides."""

import pytest

from cockpit_lite.diagnosis import Diagnosis


def run(held, train, every=5):
    """Findings of a run that logs ``held``/``train`` losses every ``every`` steps (records in between)."""
    diagnosis = Diagnosis(names=["0.weight", "0.bias", "2.weight", "2.bias"], shapes=[(8, 4), (8,), (3, 8), (3,)])
    found = []
    for i, (h, t) in enumerate(zip(held, train)):
        for step in range(i * every, (i + 1) * every):
            entry = {"Loss": t, "ParamNorm": [5.0, 1.0, 3.0, 0.5], "UpdateSize": [0.01, 0.001, 0.006, 0.001],
                     "GradNorm": [0.5, 0.1, 0.4, 0.1]}
            if step == i * every:
                entry.update(valid_loss=h, train_loss=t)
            found += [(f, step) for f in diagnosis.feed(step, entry)[0] if f.kind == "overfitting"]
    return found


FALLING = [2.3 * 0.7 ** i for i in range(40)]  # the training loss falls all along, far below the held-out loss


def test_a_transient_rise_is_not_overfitting():
    """The held-out loss of a healthy run at 0.1 rises 50 % for three logs (a warm restart) and comes back,
    its training loss close below it."""
    held = [2.3 * 0.8 ** i for i in range(10)] + [0.11] * 5 + [0.16, 0.17, 0.15] + [0.1] * 10
    train = [max(0.05, h * 0.8) for h in held]
    assert run(held, train) == []


def test_one_noisy_evaluation_is_not_overfitting():
    held = [2.3 * 0.8 ** i for i in range(10)] + [0.1, 0.4, 0.1, 0.1, 0.45, 0.1, 0.1] + [0.1] * 8
    assert run(held, FALLING[:len(held)]) == []


def test_a_rise_within_the_noise_between_evaluations_is_not_overfitting():
    """A held-out loss that scatters by +-0.25 between logs (a small held-out set) around a level that moves
    from 0.7 to 0.8: 14 % up, but well within twice its noise."""
    held = [2.3 * 0.86 ** i for i in range(6)] + [0.45, 0.7, 0.95] * 4 + [0.55, 0.8, 1.05] * 4
    assert run(held, FALLING[:len(held)]) == []


def test_a_sustained_rise_with_memorised_training_data_is_found_within_a_few_logs():
    """Minimum 0.7 at log 8 (step 40), then +5 % per log while the training loss falls towards 0."""
    held = [2.3 * 0.86 ** i for i in range(9)] + [0.7 * 1.05 ** k for k in range(1, 20)]
    found = run(held, FALLING[:len(held)])
    assert len(found) == 1, found
    finding, seen = found[0]
    assert finding.step in (40, 45, 50)  # the best held-out level: where to stop
    assert seen <= 40 + 30, seen  # within 30 steps (6 logs) of the minimum


def test_a_rise_close_to_the_training_loss_is_not_memorisation():
    """The held-out loss rises 3 % per log from 0.7 while the training loss falls 4 % per log from 0.63:
    a real rise, but the held-out loss stays within 2.5x of the training loss."""
    held = [2.3 * 0.86 ** i for i in range(9)] + [0.7 * 1.03 ** k for k in range(1, 12)]
    train = [0.9 * h for h in held[:9]] + [0.63 * 0.96 ** k for k in range(1, 12)]
    assert run(held, train) == []


def test_both_losses_rising_is_not_overfitting():
    """The held-out loss rises 5 % per log after its minimum and the training loss with it (a divergence)."""
    held = [2.3 * 0.86 ** i for i in range(9)] + [0.7 * 1.05 ** k for k in range(1, 20)]
    train = FALLING[:9] + [FALLING[8] * 1.05 ** k for k in range(1, 20)]
    assert run(held, train) == []


def test_a_log_of_epoch_losses_alone_is_read_and_quoted():
    """Only ``cp.log``'s epoch losses, no mini-batch losses (train_loss is the training loss). Medians of 3 logs:
    held-out 1.0 (best, log 2), 1.1, then 2.5 at log 4; training 1.0, then 0.8 at log 4, exactly 1 - 0.2 of it
    (the fall's bound, included) and 2.5 / 0.8 = 3.1x below the held-out level. The held-out loss's steps
    |diff| 0.1, 0.1, 1.5, 0.1 (median 0.1) give the noise 1.4826 * 0.1 / sqrt(2) = 0.1048: a rise of 14x it."""
    diagnosis = Diagnosis()
    held, train = [1.0, 1.1, 1.0, 2.5, 2.6, 2.5], [1.0, 1.0, 1.0, 0.8, 0.8, 0.8]
    found = []
    for i, (h, t) in enumerate(zip(held, train)):
        found += [(f, 10 * i) for f in diagnosis.feed(10 * i, {"valid_loss": h, "train_loss": t})[0]
                  if f.kind == "overfitting"]
    (finding, seen), = found
    assert finding.step == 20 and seen == 40
    noise = finding.evidence.pop("noise")
    assert noise == pytest.approx(1.4826 * 0.1 / 2 ** 0.5, rel=1e-3)
    assert finding.evidence == {"held_out_min": 1.0, "held_out": 2.5, "train_then": 1.0, "train": 0.8, "step_seen": 40}
    assert finding.message == ("the held-out loss rose from 1 (step 20) to 2.5 at step 40 (medians of 3 logs; 14x its "
                               "noise between logs) while the training loss fell from 1 to 0.8, 3.1x below it: the "
                               "model memorises the training set")


def _logged_every_10(held, train_loss=None):
    """Findings of records with a mini-batch loss 1 - 0.01 s at every step s and ``held`` (valid_loss) logged at
    every 10th step, with ``train_loss`` beside it when given."""
    diagnosis, found = Diagnosis(), []
    for step in range(10 * len(held)):
        entry = {"Loss": 1.0 - 0.01 * step}
        if step % 10 == 0:
            entry["valid_loss"] = held[step // 10]
            if train_loss is not None:
                entry["train_loss"] = train_loss[step // 10]
        found += [(f, step) for f in diagnosis.feed(step, entry)[0] if f.kind == "overfitting"]
    return found


def test_without_a_logged_training_loss_the_median_of_the_last_5_batch_losses_is_read():
    """No train_loss: at a log of step t the training loss is the median of the last 5 mini-batch losses, that of
    step t - 2 (1 at step 0, of its one record): logs 0, 10, 20 give 1, 0.92, 0.82 (level 0.92, the best held-out
    level's, step 20), logs 20, 30, 40 give 0.82, 0.72, 0.62 (level 0.72 at step 40, where the held-out level is 2.5)."""
    (finding, seen), = _logged_every_10([1.0, 1.1, 1.0, 2.5, 2.6, 2.5])
    assert (finding.step, seen) == (20, 40)
    assert finding.evidence["train_then"] == 0.92 and finding.evidence["train"] == 0.72


def test_a_logged_training_loss_is_read_before_the_batch_losses():
    """The same records with train_loss logged at 1.0, then 0.5 from log 3: the logged values decide (levels 1.0
    and 0.5), not the mini-batch losses."""
    (finding, _), = _logged_every_10([1.0, 1.1, 1.0, 2.5, 2.6, 2.5], train_loss=[1.0, 1.0, 1.0, 0.5, 0.5, 0.5])
    assert finding.evidence["train_then"] == 1.0 and finding.evidence["train"] == 0.5


def test_a_tie_with_the_best_held_out_level_keeps_the_earlier_step():
    """Held-out levels 1.0 at logs 2 and 3 (steps 20 and 30): where to stop is the first, step 20."""
    (finding, _), = _logged_every_10([1.0, 1.0, 1.0, 1.0, 2.5, 2.6, 2.5])
    assert finding.step == 20 and finding.evidence["held_out_min"] == 1.0


def test_the_noise_is_read_from_the_last_10_differences_between_logs():
    """A held-out loss alternating around 1 with a shrinking swing (1.13, 0.88, 1.11, ...), then 3.0, 3.1, 3.0:
    found at log 14 (step 140). Its last 10 differences (logs 4-14) are 0.17, 0.15, ..., 0.03, 1.99 and 0.1,
    median (0.1 + 0.11) / 2, so σ = 1.4826 · 0.105 / √2 (9 or 11 differences give another median)."""
    held = [1.0 + 0.01 * (13 - k) * (-1) ** k for k in range(13)] + [3.0, 3.1, 3.0]
    diagnosis, found = Diagnosis(), []
    for step in range(10 * len(held)):
        entry = {"Loss": 1.0 - 0.005 * step, **({"valid_loss": held[step // 10]} if step % 10 == 0 else {})}
        found += [(f, step) for f in diagnosis.feed(step, entry)[0] if f.kind == "overfitting"]
    (finding, seen), = found
    assert seen == 140
    assert finding.evidence["noise"] == pytest.approx(1.4826 * 0.105 / 2 ** 0.5, rel=1e-3)


def _epoch_findings(held, train):
    """Findings of a log of epoch losses alone, one log every 10 steps."""
    diagnosis, found = Diagnosis(), []
    for i, (h, t) in enumerate(zip(held, train)):
        found += [(f, 10 * i) for f in diagnosis.feed(10 * i, {"valid_loss": h, "train_loss": t})[0]
                  if f.kind == "overfitting"]
    return found


@pytest.mark.parametrize("held, train, seen", [
    # the rise's bound: the held-out level 1.1 is exactly 1.1 x the best level 1.0 (no noise between logs)
    ([1.0, 1.0, 1.0, 1.0, 1.1, 1.1, 1.1], [1.0, 1.0, 1.0, 0.3, 0.3, 0.3, 0.3], 50),
    # the gap's bound: the held-out level 1.5 is exactly 3 x the training level 0.5
    ([1.0, 1.0, 1.0, 1.0, 1.5, 1.5, 1.5], [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5], 50),
    # the training level fell by 10 % only (0.9 of 1.0, not the 20 % needed), the held-out level 3.9x above it
    ([1.0, 1.1, 1.0, 3.5, 3.6, 3.5], [1.0, 1.0, 1.0, 0.9, 0.9, 0.9], None),
])
def test_the_bounds_of_the_rise_and_the_gap_are_included_and_the_training_loss_must_fall(held, train, seen):
    found = _epoch_findings(held, train)
    assert [s for _, s in found] == ([seen] if seen is not None else [])
    if found:
        assert found[0][0].step == 20
        assert found[0][0].suggestion.startswith("stop early (keep the checkpoint of step 20, the held-out minimum)")


def test_a_rise_of_exactly_twice_the_noise_is_found():
    """The held-out loss alternates 1, h for 12 logs (h = 1 + 0.060001: every difference d = h - 1, best level 1
    at log 2), then v, v: at log 13 the level is v, the last 10 differences are 8 x d, v - h and 0 (median d), and
    v = 1 + 2σ with σ = 1.4826 d / √2, so the rise is 2σ exactly (d was picked so that 1 + 2σ - 1 rounds back to
    2σ). The training level fell from 1 to 0.1."""
    h = 1.0 + 0.060001
    sigma = 1.4826 * (h - 1.0) / 2 ** 0.5
    v = 1.0 + 2.0 * sigma
    assert v - 1.0 == 2.0 * sigma and v >= 1.1  # the bound of the noise, not of the rise, is the one met
    found = _epoch_findings([1.0, h] * 6 + [v, v], [1.0] * 6 + [0.1] * 8)
    assert [(f.step, seen) for f, seen in found] == [(20, 130)]
