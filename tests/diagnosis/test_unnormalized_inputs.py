"""``unnormalized_inputs`` on hand-made records: an input layer that normalises makes the finding an
``info`` note naming that layer; otherwise a warning."""

import pytest

from cockpit_lite.diagnosis import Diagnosis


@pytest.mark.parametrize("layer, severity, said", [
    ({"name": "stem.bn", "type": "BatchNorm2d"}, "info", "the first layer 'stem.bn' (BatchNorm2d) normalises them"),
    ({"name": "stem.conv", "type": "Conv2d"}, "warning", "far from unit scale"),
])
def test_inputs_at_pixel_scale_are_a_note_when_the_first_layer_normalises_them(layer, severity, said):
    diagnosis = Diagnosis()
    for step in range(2):
        diagnosis.feed(step, {"InputStats": {"mean": 120.0, "std": 70.0, "min": 0.0, "max": 255.0},
                              "meta": {"ActivationStats": {"input_layer": layer}}})
    (finding,) = [f for f in diagnosis.findings if f.kind == "unnormalized_inputs"]
    assert finding.severity == severity and said in finding.message, finding.message
    assert finding.evidence["input_layer"] == layer and finding.evidence["mean"] == 120.0
