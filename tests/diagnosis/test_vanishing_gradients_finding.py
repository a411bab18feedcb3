"""``vanishing_gradients`` on hand-made records: the layer, the shrink factor and the count of
affected weight tensors (r ≤ ``VANISH_RATIO`` · r of the output end, the bound included)."""

import pytest

from cockpit_lite.diagnosis import Diagnosis

NAMES = [f"l{i}.weight" for i in range(1, 6)]


def test_affected_tensors_count_the_bound_and_the_shrink_is_first_over_output_end():
    """‖θ‖ = 1 for all five, ‖g‖ = 1e-4, 5e-4, 1e-3, 0.5, 0.8: the output end's r is 0.5 (the smaller of
    the last two), the first's 1e-4 (shrink 2e-4 ≤ 1e-3); below 1e-3 · 0.5 = 5e-4 are l1 and l2 (exactly
    on it); l3 (1e-3) is not."""
    diagnosis = Diagnosis(names=NAMES, shapes=[(4, 4)] * 5)
    for step in range(4):
        diagnosis.feed(step, {"GradNorm": [1e-4, 5e-4, 1e-3, 0.5, 0.8], "ParamNorm": [1.0] * 5})
    (finding,) = [f for f in diagnosis.findings if f.kind == "vanishing_gradients"]
    assert finding.layer == "l1" and finding.step == 0
    assert finding.evidence["first_to_output"] == pytest.approx(2e-4, rel=1e-12)
    assert finding.evidence["affected"] == 2 and finding.evidence["weights"] == 5
    assert finding.message.endswith("since step 0; 2 of 5 weight tensors are below 0.001 of it"), finding.message
    assert finding.suggestion.startswith("use ReLU-family activations instead of sigmoid/tanh, Kaiming initialisation")


def test_the_message_quotes_the_shrink_to_two_digits():
    """‖g‖ of the first tensor 1.234e-4, of the output end 0.5 (‖θ‖ = 1): the shrink 2.468e-4 reads 0.00025."""
    diagnosis = Diagnosis(names=NAMES, shapes=[(4, 4)] * 5)
    for step in range(4):
        diagnosis.feed(step, {"GradNorm": [1.234e-4, 5e-4, 1e-3, 0.5, 0.8], "ParamNorm": [1.0] * 5})
    (finding,) = [f for f in diagnosis.findings if f.kind == "vanishing_gradients"]
    assert "'l1' gets 0.00025 of the output layers' gradient" in finding.message, finding.message


def test_a_record_without_gradient_at_the_output_end_breaks_the_streak():
    """r of the output end 0 at step 2 (no finding possible there: nothing to compare with); the streak
    starts again at step 3 and is found at step 5, naming step 3."""
    diagnosis = Diagnosis(names=NAMES, shapes=[(4, 4)] * 5)
    for step in range(6):
        out = [0.0, 0.0] if step == 2 else [0.3, 0.5]
        diagnosis.feed(step, {"GradNorm": [1e-4, 5e-4, 1e-3, *out], "ParamNorm": [1.0] * 5})
    (finding,) = [f for f in diagnosis.findings if f.kind == "vanishing_gradients"]
    assert finding.step == 3


def test_it_is_reported_once_even_when_its_first_tensor_changes():
    """l1 vanishes on steps 0-3; from step 4 its gradient is absent (NaN: the layer frozen) and l2 (r 2e-4, below
    1e-3 · 0.5) becomes the first weight tensor: the rule has reported, and names no second layer."""
    diagnosis = Diagnosis(names=NAMES, shapes=[(4, 4)] * 5)
    for step in range(8):
        first = 1e-4 if step < 4 else float("nan")
        diagnosis.feed(step, {"GradNorm": [first, 1e-4, 1e-3, 0.3, 0.5], "ParamNorm": [1.0] * 5})
    assert [(f.layer, f.step) for f in diagnosis.findings if f.kind == "vanishing_gradients"] == [("l1", 0)]


def test_the_output_end_is_the_last_two_weight_tensors_only():
    """r = 1e-4, 0.15, 1.0, 0.2, 0.3: the output end is min(0.2, 0.3) = 0.2, so the first gets 1e-4 / 0.2 = 5e-4
    of it; the third tensor's 1.0, before the output end, must not count (with it the shrink would read 1e-4)."""
    diagnosis = Diagnosis(names=NAMES, shapes=[(4, 4)] * 5)
    for step in range(3):
        diagnosis.feed(step, {"GradNorm": [1e-4, 0.15, 1.0, 0.2, 0.3], "ParamNorm": [1.0] * 5})
    (finding,) = [f for f in diagnosis.findings if f.kind == "vanishing_gradients"]
    assert finding.evidence["first_to_output"] == pytest.approx(1e-4 / 0.2, rel=1e-3)  # (4 digits kept)


def test_one_odd_tensor_at_the_output_end_is_not_the_output_end():
    """MLP-Mixer's head, zero-initialised, once past ``TINY_WEIGHT`` (timm, AdamW with warm-up, steps 3-9):
    r = 41, 15, 11 while the layer before it had 1.3e-4 - 7e-4, as had the first (1.8e-4 - 1.1e-3): the input
    end gets as much as the rest of the body, nothing vanishes through the depth. (With the larger of the last
    two as the output end: found, "17 of 18 weight tensors below 0.001 of it".)"""
    diagnosis = Diagnosis(names=NAMES, shapes=[(4, 4)] * 5)
    for step, (first, body, head) in enumerate([(1.8e-4, 1.3e-4, 41.0), (3.1e-4, 2e-4, 15.0), (1.1e-3, 6.9e-4, 11.0)]):
        diagnosis.feed(step, {"GradNorm": [first, body, body, body, head], "ParamNorm": [1.0] * 5})
    assert not [f for f in diagnosis.findings if f.kind == "vanishing_gradients"], diagnosis.findings


def test_of_two_weight_tensors_the_output_end_is_the_last():
    """The first weight tensor is the input end, never its own output end: r = 1e-4 and 0.5 is found."""
    diagnosis = Diagnosis(names=NAMES[:2], shapes=[(4, 4)] * 2)
    for step in range(3):
        diagnosis.feed(step, {"GradNorm": [1e-4, 0.5], "ParamNorm": [1.0] * 2})
    (finding,) = [f for f in diagnosis.findings if f.kind == "vanishing_gradients"]
    assert finding.evidence["first_to_output"] == pytest.approx(2e-4, rel=1e-3)


def test_a_record_without_the_relative_gradients_breaks_the_streak():
    """Vanishing at steps 0 and 1, a record of step 2 without GradNorm (nothing to compare), vanishing again
    from step 3: three records in a row only at step 5, and the finding names step 3."""
    diagnosis = Diagnosis(names=NAMES, shapes=[(4, 4)] * 5)
    for step in range(6):
        entry = {"Loss": 1.0} if step == 2 else {"GradNorm": [1e-4, 5e-4, 1e-3, 0.3, 0.5], "ParamNorm": [1.0] * 5}
        diagnosis.feed(step, entry)
        found = [f for f in diagnosis.findings if f.kind == "vanishing_gradients"]
        assert bool(found) == (step >= 5), step
    assert found[0].step == 3


def test_a_shrink_exactly_at_the_bound_is_found():
    """r of the first tensor 5e-4, of the output end 0.5: the shrink is exactly ``VANISH_RATIO`` (1e-3), included."""
    diagnosis = Diagnosis(names=NAMES, shapes=[(4, 4)] * 5)
    for step in range(3):
        diagnosis.feed(step, {"GradNorm": [5e-4, 0.1, 0.2, 0.5, 0.8], "ParamNorm": [1.0] * 5})
    (finding,) = [f for f in diagnosis.findings if f.kind == "vanishing_gradients"]
    assert finding.evidence["first_to_output"] == 1e-3 and finding.evidence["affected"] == 1
