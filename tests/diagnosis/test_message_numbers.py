"""Every number in a message comes from the step it names."""


from cockpit_lite.diagnosis import Diagnosis


def test_edge_of_stability_quotes_the_sharpness_of_the_step_it_names():
    diagnosis = Diagnosis(names=["w"], shapes=[(1, 5)])
    presence = {"lr": 0.3, "optimizer": "SGD", "momentum": 0.0}
    for step, sharpness in enumerate([8.2, 17.4, 20.0]):
        diagnosis.feed(step, {"HessMaxEV": sharpness, "GradPresence": presence})
    found = [f for f in diagnosis.findings if f.kind == "edge_of_stability"]
    assert len(found) == 1 and found[0].step == 0
    assert found[0].evidence["lambda_max"] == 8.2
    first_sentence = found[0].message.split(", and")[0]
    assert "8.2" in first_sentence and "at step 0" in first_sentence and "17.4" not in first_sentence
    assert "17.4" not in found[0].message or "at step 1" in found[0].message


def test_unnormalized_inputs_names_the_step_of_its_numbers():
    """Its numbers are those of the step the finding names (the streak's first record), and
    that is the only step the message names (it used to say step 0 above "at step 1")."""
    diagnosis = Diagnosis()
    for step, mean in enumerate([100.0, 120.0]):
        diagnosis.feed(step, {"InputStats": {"mean": mean, "std": 80.0, "min": 0.0, "max": 255.0}})
    (finding,) = diagnosis.findings
    assert finding.step == 0 and finding.evidence["mean"] == 100.0
    assert "mean 100" in finding.message and "at step 0" in finding.message, finding.message
    assert "step 1" not in finding.message
