"""``shuffled_labels``: at chance held out (10 classes: up to 20 %) on 3 logs while the training loss stays at
L0; not while the training loss learns (a train/eval gap such as lagging BatchNorm statistics), nor while the
activations fade through the layers (a deep net's plateau at initialisation)."""

import math

import pytest

from cockpit_lite.diagnosis import Diagnosis


def run(accuracy, loss=lambda s: 2.3, activations=None, grads=(0.5, 0.1, 0.4, 0.1), updates=1.0):
    """``{kind: finding}`` of a run logging held-out ``accuracy(step)`` every 10 steps; ``activations``: RMS of each
    ReLU module (``ActivationStats``); ``grads``: GradNorm (the weights' norms are 5 and 3); ``updates``: a factor on
    the updates (or ``updates(step)``), ||dθ|| / ||θ|| = 0.01 at 1."""
    diagnosis = Diagnosis(names=["0.weight", "0.bias", "2.weight", "2.bias"], shapes=[(8, 4), (8,), (3, 8), (3,)])
    for step in range(61):
        factor = updates(step) if callable(updates) else updates
        entry = {"Loss": loss(step), "ParamNorm": [5.0, 1.0, 3.0, 0.5],
                 "UpdateSize": [factor * u for u in (0.05, 0.01, 0.03, 0.005)], "GradNorm": list(grads)}
        if activations is not None:
            entry["ActivationStats"] = {str(i): {"type": "ReLU", "mean": a, "std": 0.0} for i, a in enumerate(activations)}
        if step % 10 == 0:
            entry.update(valid_loss=2.3, valid_accuracy=accuracy(step))
        diagnosis.feed(step, entry)
    return {f.kind: f for f in diagnosis.findings}


def test_chance_on_three_logs_is_found_up_to_twice_chance():
    assert "shuffled_labels" in run(lambda s: 0.18)
    assert "shuffled_labels" not in run(lambda s: 0.25)


def test_two_logs_at_chance_then_learning_is_not():
    assert "shuffled_labels" not in run(lambda s: 0.1 if s <= 20 else 0.5)


def test_a_training_loss_that_learns_while_held_out_is_at_chance_is_not():
    assert "shuffled_labels" not in run(lambda s: 0.1, loss=lambda s: 2.3 * 0.98 ** s)


def test_activations_that_fade_through_the_layers_are_a_plateau_not_shuffled_labels():
    assert "shuffled_labels" not in run(lambda s: 0.1, activations=[0.4, 0.2, 0.1, 0.05])
    assert "shuffled_labels" in run(lambda s: 0.1, activations=[0.4, 0.3, 0.4, 0.35])


def test_two_classes_are_at_chance_up_to_half_way_to_100_percent():
    """L0 = ln 2: two classes, chance 50 %; twice chance is 100 %, so the bound is half way: 75 %."""
    found = run(lambda s: 0.6, loss=lambda s: math.log(2.0))
    assert "chance for ~2 classes: 50%" in found["shuffled_labels"].message
    assert "shuffled_labels" not in run(lambda s: 0.8, loss=lambda s: math.log(2.0))


def test_at_chance_without_gradient_at_the_input_end_is_not_shuffled_labels():
    """||g||/||w|| of the first weight tensor 5e-5 / 5 = 1e-5, below 1e-3 of the output end's 0.4 / 3:
    the gradient does not reach the inputs (a vanishing gradient's plateau), whatever the labels."""
    assert "shuffled_labels" not in run(lambda s: 0.1, grads=(5e-5, 0.1, 0.4, 0.1))


def test_at_chance_while_the_loss_rises_half_again_is_not_shuffled_labels():
    """The loss 2.3 for 10 steps, then 3.5 (1.5 L0, above 1.1 L0): a diverging run, not labels at chance."""
    assert "shuffled_labels" not in run(lambda s: 0.1, loss=lambda s: 2.3 if s < 10 else 3.5)


def test_a_training_loss_exactly_at_the_chance_loss_bound_has_not_learned():
    """L0 = 2 (C = round(e²) = 7, at most 2/7 held out), then the loss 1.9 = 0.95 L0 (2 · 0.95 is exact in binary):
    on the bound, not below it, so the training loss has not learned and 10 % held out is found; 1.89 has learned."""
    assert "shuffled_labels" in run(lambda s: 0.1, loss=lambda s: 2.0 if s < 3 else 1.9)
    assert "shuffled_labels" not in run(lambda s: 0.1, loss=lambda s: 2.0 if s < 3 else 1.89)


def test_a_first_layer_at_exactly_1e_3_of_the_output_end_s_relative_gradient_is_not_flowing():
    """||g||/||w|| of the first weight tensor 0.005 / 5 = 1e-3, exactly 1e-3 of the output end's 3 / 3 = 1: the
    bound of vanishing_gradients, included, so the gradient does not reach the inputs; 0.0051 / 5 is above it."""
    assert "shuffled_labels" not in run(lambda s: 0.1, grads=(0.005, 0.1, 3.0, 0.1))
    assert "shuffled_labels" in run(lambda s: 0.1, grads=(0.0051, 0.1, 3.0, 0.1))
    # 1.5e-3 / 5 = 3e-4 is 2.25e-3 of the output end's 0.4 / 3: above the bound, the gradient flows
    assert "shuffled_labels" in run(lambda s: 0.1, grads=(1.5e-3, 0.1, 0.4, 0.1))


@pytest.mark.parametrize("activations, found", [
    ([0.4, 0.4, 0.4, 0.1], False),   # the last module's RMS over the first's: 1/4, faded
    ([0.1, 0.4, 0.4, 0.1], True),    # 1: not faded, whatever the modules between
    ([3.0, 2.0, 2.0, 1.0], False),   # exactly 1/3 (1 / ACT_GAIN), included
    ([0.4, 0.3, 0.3, 0.2], True),    # 1/2: above 1/3
])
def test_the_activations_fade_when_the_last_module_s_rms_is_at_most_a_third_of_the_first_s(activations, found):
    assert ("shuffled_labels" in run(lambda s: 0.1, activations=activations)) == found


def test_a_log_of_held_out_metrics_without_a_training_loss_is_not_judged():
    """valid_accuracy at chance, but no mini-batch loss: no L0, so no number of classes; nothing found, nothing
    fails."""
    diagnosis = Diagnosis()
    for step in range(0, 100, 10):
        diagnosis.feed(step, {"valid_accuracy": 0.1})
    assert diagnosis.findings == [] and diagnosis.failures == []


def test_a_loss_of_exactly_0_gives_no_number_of_classes():
    """A hinge loss at 0 from the start (L0 = 0): no number of classes to call chance, so a held-out accuracy of
    50 % is not judged."""
    assert "shuffled_labels" not in run(lambda s: 0.5, loss=lambda s: 0.0)


def test_held_out_logs_count_from_the_10th_loss_on():
    """Held-out accuracy at chance logged at steps 9, 10 and 11 only: at step 9 the history holds 10 losses
    (MIN_STEPS, included), so the three logs make the streak, found from step 9."""
    diagnosis = Diagnosis(names=["0.weight", "0.bias", "2.weight", "2.bias"], shapes=[(8, 4), (8,), (3, 8), (3,)])
    for step in range(12):
        entry = {"Loss": 2.3, "ParamNorm": [5.0, 1.0, 3.0, 0.5], "UpdateSize": [0.05, 0.01, 0.03, 0.005],
                 "GradNorm": [0.5, 0.1, 0.4, 0.1], **({"valid_accuracy": 0.1} if step >= 9 else {})}
        diagnosis.feed(step, entry)
    assert [f.step for f in diagnosis.findings if f.kind == "shuffled_labels"] == [9]


def test_the_number_of_classes_read_from_a_large_loss_is_capped_at_e_to_the_20():
    """L0 = 1000 (a loss summed over the batch): exp(L0) would overflow; the classes are capped at round(e^20)."""
    found = run(lambda s: 0.0, loss=lambda s: 1000.0)
    assert found["shuffled_labels"].evidence["classes"] == round(math.exp(20.0))


def test_the_message_quotes_the_accuracy_the_chance_and_the_median_of_the_last_5_losses():
    """L0 = 2 (7 classes, chance 14.3 %); at step 30 the last 5 losses are 2, 2, 2, 2.1, 2.1 (median 2; with step
    25's 2.1 the last 6 would give 2.05)."""
    found = run(lambda s: 0.1234, loss=lambda s: 2.1 if s in (25, 29, 30) else 2.0)["shuffled_labels"]
    assert found.step == 10
    assert found.message == ("held-out accuracy is 12.3% at step 30 (chance for ~7 classes: 14.3%) while training "
                             "moves the weights and the loss goes 2 -> 2: the labels look independent of the inputs")
    assert found.suggestion == ("check that inputs and labels are shuffled together (same permutation / same dataset "
                                "index) and that the label column is the right one")
    assert found.evidence == {"accuracy": 0.1234, "chance": 0.1429, "classes": 7, "loss": 2.0}


def test_the_training_loss_has_learned_by_the_median_of_its_last_3_records():
    """At step 30 the last 3 losses are 1.5, 2, 2 (median 2, not below 0.95 L0 = 1.9); the last 4, 1.5, 1.5, 2, 2,
    would say it learned."""
    assert run(lambda s: 0.1, loss=lambda s: 1.5 if s in (27, 28) else 2.0)["shuffled_labels"].step == 10


def test_the_weights_move_by_the_median_of_the_last_5_updates():
    """At step 30 the last 6 relative updates are 1e-5 three times, then 3.2e-4, 1e-3, 1e-3: the last 5's median
    3.2e-4 is above 3e-4 (the weights move: found from step 10), the last 6's would be 1.65e-4."""
    factor = {25: 1e-3, 26: 1e-3, 27: 1e-3, 28: 0.032}
    found = run(lambda s: 0.1, updates=lambda s: factor.get(s, 0.1 if s > 28 else 1.0))
    assert found["shuffled_labels"].step == 10


def test_weights_that_barely_move_are_not_shuffled_labels():
    """||dθ|| / ||θ|| = 1e-5, below 3e-4: the run does not train, whatever the labels."""
    assert "shuffled_labels" not in run(lambda s: 0.1, updates=1e-3)


def test_the_bounds_of_the_accuracy_the_loss_and_the_updates_are_included():
    """L0 = ln 2 (two classes): an accuracy of exactly 75 % is at chance; L0 = 2 and a loss of exactly 1.1 L0 = 2.2 is
    not diverging; ||dθ|| / ||θ|| exactly 3e-4 (||θ|| = |(3, 0, 4, 0)| = 5) moves the weights."""
    assert "shuffled_labels" in run(lambda s: 0.75, loss=lambda s: math.log(2.0))
    assert "shuffled_labels" in run(lambda s: 0.1, loss=lambda s: 2.0 if s < 3 else 2.2)
    diagnosis = Diagnosis(names=["0.weight", "0.bias", "2.weight", "2.bias"], shapes=[(8, 4), (8,), (3, 8), (3,)])
    for step in range(31):
        diagnosis.feed(step, {"Loss": 2.3, "ParamNorm": [3.0, 0.0, 4.0, 0.0], "UpdateSize": [3e-4 * 5.0, 0.0, 0.0, 0.0],
                              "GradNorm": [0.5, 0.1, 0.4, 0.1], **({"valid_accuracy": 0.1} if step % 10 == 0 else {})})
    assert [f.step for f in diagnosis.findings if f.kind == "shuffled_labels"] == [10]


def test_a_log_of_losses_and_held_out_accuracy_alone_is_judged():
    """No gradient or parameter norms: nothing says the gradient does not reach the inputs, nor that the weights
    do not move; at chance on three logs, found."""
    diagnosis = Diagnosis()
    for step in range(41):
        diagnosis.feed(step, {"Loss": 2.3, **({"valid_accuracy": 0.1} if step % 10 == 0 else {})})
    assert [f.step for f in diagnosis.findings if f.kind == "shuffled_labels"] == [10]
