"""``unnormalized_inputs`` on hand-made records: an input layer that normalises makes the finding an
``info`` note naming that layer; otherwise a warning."""

import pytest

from cockpit_lite.diagnosis import Diagnosis


@pytest.mark.parametrize("layer, severity, said, fix", [
    ({"name": "stem.bn", "type": "BatchNorm2d"}, "info", "the first layer 'stem.bn' (BatchNorm2d) normalises them",
     "none needed; standardising the inputs would still make the layer's running statistics easier to read"),
    ({"name": "stem.conv", "type": "Conv2d"}, "warning", "far from unit scale",
     "standardise the inputs (subtract the training mean, divide by the std; images: divide by 255 first)"),
])
def test_inputs_at_pixel_scale_are_a_note_when_the_first_layer_normalises_them(layer, severity, said, fix):
    diagnosis = Diagnosis()
    for step in range(2):
        diagnosis.feed(step, {"InputStats": {"mean": 120.0, "std": 70.0, "min": 0.0, "max": 255.0},
                              "meta": {"ActivationStats": {"input_layer": layer}}})
    (finding,) = [f for f in diagnosis.findings if f.kind == "unnormalized_inputs"]
    assert finding.severity == severity and said in finding.message, finding.message
    assert finding.evidence["input_layer"] == layer and finding.evidence["mean"] == 120.0
    assert finding.suggestion == fix


def test_the_finding_quotes_the_range_of_the_streak_s_first_record():
    """Two records at pixel scale: the finding names step 0 and its mean, std, min and max."""
    diagnosis = Diagnosis()
    for step, high in enumerate([255.0, 254.0]):
        diagnosis.feed(step, {"InputStats": {"mean": 120.0, "std": 70.0, "min": 1.0, "max": high}})
    (finding,) = [f for f in diagnosis.findings if f.kind == "unnormalized_inputs"]
    assert finding.message.startswith("the model's inputs have mean 120 and std 70 (range 1 .. 255) at step 0")
    assert finding.evidence == {"mean": 120.0, "std": 70.0, "min": 1.0, "max": 255.0, "input_layer": None}


@pytest.mark.parametrize("scale, found", [(10.0, True), (9.999, False)])
def test_the_scale_bound_is_included(scale, found):
    """max(|mean|, std) of ``INPUT_SCALE`` (10) on two records is found; just below it is not."""
    diagnosis = Diagnosis()
    for step in range(2):
        diagnosis.feed(step, {"InputStats": {"mean": -scale, "std": 1.0, "min": -12.0, "max": -8.0}})
    assert bool([f for f in diagnosis.findings if f.kind == "unnormalized_inputs"]) is found


def test_inputs_at_unit_scale_or_pixel_scale_once_are_no_finding():
    """Unit-scale inputs, and one pixel-scale batch among them: no finding, and the rule does not fail."""
    diagnosis = Diagnosis()
    for step in range(4):
        scale = 120.0 if step == 1 else 0.1
        diagnosis.feed(step, {"InputStats": {"mean": scale, "std": 1.0, "min": -3.0, "max": 3.0}})
    assert diagnosis.failures == [] and not [f for f in diagnosis.findings if f.kind == "unnormalized_inputs"]


def test_an_input_layer_that_is_no_dict_is_left_out():
    """A hand-made record whose ``meta.ActivationStats.input_layer`` is a bare name: not taken as the layer (the
    finding is a warning without one), and the rule does not fail."""
    diagnosis = Diagnosis()
    for step in range(2):
        diagnosis.feed(step, {"InputStats": {"mean": 120.0, "std": 70.0, "min": 0.0, "max": 255.0},
                              "meta": {"ActivationStats": {"input_layer": "stem.bn"}}})
    (finding,) = [f for f in diagnosis.findings if f.kind == "unnormalized_inputs"]
    assert diagnosis.failures == [] and finding.severity == "warning" and finding.evidence["input_layer"] is None
