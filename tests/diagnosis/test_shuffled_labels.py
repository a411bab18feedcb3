"""``shuffled_labels``: at chance held out (10 classes: up to 20 %) on 3 logs while the training loss stays at
L0; not while the training loss learns (a train/eval gap such as lagging BatchNorm statistics), nor while the
activations fade through the layers (a deep net's plateau at initialisation)."""

from cockpit_lite.diagnosis import Diagnosis


def run(accuracy, loss=lambda s: 2.3, activations=None):
    """Kinds found on a run logging held-out ``accuracy(step)`` every 10 steps; ``activations``: RMS of each
    ReLU module (``ActivationStats``)."""
    diagnosis = Diagnosis(names=["0.weight", "0.bias", "2.weight", "2.bias"], shapes=[(8, 4), (8,), (3, 8), (3,)])
    for step in range(61):
        entry = {"Loss": loss(step), "ParamNorm": [5.0, 1.0, 3.0, 0.5], "UpdateSize": [0.05, 0.01, 0.03, 0.005],
                 "GradNorm": [0.5, 0.1, 0.4, 0.1]}
        if activations is not None:
            entry["ActivationStats"] = {str(i): {"type": "ReLU", "mean": a, "std": 0.0} for i, a in enumerate(activations)}
        if step % 10 == 0:
            entry.update(valid_loss=2.3, valid_accuracy=accuracy(step))
        diagnosis.feed(step, entry)
    return {f.kind for f in diagnosis.findings}


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
