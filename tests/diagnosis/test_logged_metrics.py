"""Epoch metrics logged with ``cp.log``: the held-out numbers are read from the valid slot, else the
test slot, a stored ``None`` skipped (``cp.log(step, epoch, train_loss, None, test_loss, None, None,
test_accuracy, lr)`` is how a loop with a test set only calls it)."""

from cockpit_lite.diagnosis import Diagnosis
from cockpit_lite.diagnosis.history import logged

SLOTS = ("epoch_count", "train_loss", "valid_loss", "test_loss", "train_accuracy", "valid_accuracy",
         "test_accuracy", "learning_rate")


def log(step, train_loss, held_loss, held_accuracy, slot):
    values = dict.fromkeys(SLOTS)
    values.update(epoch_count=step // 10, train_loss=train_loss, learning_rate=0.1)
    values[f"{slot}_loss"], values[f"{slot}_accuracy"] = held_loss, held_accuracy
    return values


def findings(entries):
    diagnosis = Diagnosis(names=["0.weight", "0.bias", "2.weight", "2.bias"],
                          shapes=[(8, 4), (8,), (3, 8), (3,)])
    for step in sorted(entries):
        diagnosis.feed(step, entries[step])
    return {f.kind for f in diagnosis.findings}


def step_entry(loss):
    return {"Loss": loss, "ParamNorm": [5.0, 1.0, 3.0, 0.5], "UpdateSize": [0.01, 0.001, 0.006, 0.001],
            "GradNorm": [0.5, 0.1, 0.4, 0.1]}


def test_logged_reads_the_first_finite_slot():
    assert logged({"valid_loss": None, "test_loss": 0.5}, "valid_loss", "test_loss") == 0.5
    assert logged({"valid_loss": 0.7, "test_loss": 0.5}, "valid_loss", "test_loss") == 0.7
    assert logged({"valid_loss": float("nan")}, "valid_loss", "test_loss") is None


def chance_run(slot):
    entries = {s: step_entry(2.3) for s in range(31)}
    for s in (10, 20, 30):
        entries[s].update(log(s, 2.3, 2.31, 0.1, slot))
    return entries


def overfit_run(slot):
    entries = {s: step_entry(max(0.05, 1.0 - 0.02 * s)) for s in range(81)}
    held = (0.8, 0.7, 0.68, 0.75, 0.85, 0.95, 1.05, 1.15)  # a minimum at step 30, then a steady rise
    train = (0.9, 0.6, 0.4, 0.25, 0.15, 0.1, 0.07, 0.05)
    for s, t, h in zip(range(10, 81, 10), train, held):
        entries[s].update(log(s, t, h, 0.8, slot))
    return entries


def test_shuffled_labels_from_the_test_slot():
    assert "shuffled_labels" in findings(chance_run("valid"))
    assert "shuffled_labels" in findings(chance_run("test"))


def test_overfitting_from_the_test_slot():
    assert "overfitting" in findings(overfit_run("valid"))
    assert "overfitting" in findings(overfit_run("test"))


def test_a_rising_held_out_accuracy_is_not_shuffled_labels_whatever_the_loss_scale():
    """Accumulation x4 logs loss / 4 (L0 = 0.58 reads as ~2 classes, chance 50 %): a held-out accuracy
    that rose from 10 % to 70 % is learning."""
    entries = {s: step_entry(0.58 - 0.004 * s) for s in range(31)}
    for s, accuracy in ((0, 0.1), (10, 0.55), (20, 0.7), (30, 0.75)):
        entries[s].update(log(s, 0.5, 1.0, accuracy, "valid"))
    assert "shuffled_labels" not in findings(entries)
