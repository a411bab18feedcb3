"""``saturated_activations`` on hand-made records: the threshold (``SATURATED`` 0.5, included),
the severity (``error`` from 0.9 on), and what the message calls the values (a recurrent layer's
gate values, another module's outputs)."""

from cockpit_lite.diagnosis import Diagnosis

STATS = {"rnn": {"saturated": 0.5, "type": "LSTM"}, "gru": {"saturated": 0.7, "type": "GRU"},
         "act": {"saturated": 0.9, "type": "Tanh"}, "calm": {"saturated": 0.49, "type": "Sigmoid"}}


def test_modules_at_or_above_the_threshold_for_three_records_are_named():
    diagnosis = Diagnosis()
    for step in range(3):
        diagnosis.feed(step, {"ActivationStats": STATS})
    found = {f.layer: f for f in diagnosis.findings if f.kind == "saturated_activations"}
    assert sorted(found) == ["act", "gru", "rnn"]
    assert [found[m].severity for m in ("rnn", "gru", "act")] == ["warning", "warning", "error"]
    assert "50% of its gate values" in found["rnn"].message
    assert "70% of its gate values" in found["gru"].message
    assert "90% of its outputs" in found["act"].message
    assert all(f.step == 0 for f in found.values())
    assert found["act"].evidence == {"saturated": 0.9, "first": 0.9, "type": "Tanh"}
    assert "Xavier" in found["act"].suggestion


def test_a_record_without_a_finite_value_neither_counts_nor_breaks_the_streak():
    """0.6, NaN, 0.6, 0.6: the NaN record is skipped; three saturated records make the finding, from step 0."""
    diagnosis = Diagnosis()
    for step, value in enumerate([0.6, float("nan"), 0.6, 0.6]):
        diagnosis.feed(step, {"ActivationStats": {"act": {"saturated": value, "type": "Tanh"}}})
    (finding,) = [f for f in diagnosis.findings if f.kind == "saturated_activations"]
    assert finding.step == 0 and finding.evidence["first"] == 0.6


def test_a_module_entry_that_is_no_dict_is_skipped_and_the_rule_stays_on():
    """A hand-made record's ``ActivationStats`` may hold a module without its statistics (``None``, a number):
    that module is skipped; the rule neither fails (which would switch it off) nor stops naming the others."""
    diagnosis = Diagnosis()
    for step in range(3):
        diagnosis.feed(step, {"ActivationStats": {"broken": None, "odd": 0.95, "act": {"saturated": 0.9, "type": "Tanh"}}})
    assert diagnosis.failures == []
    assert [f.layer for f in diagnosis.findings if f.kind == "saturated_activations"] == ["act"]


def test_the_message_names_the_step_the_streak_began():
    """Calm at steps 0 and 1, saturated from step 2 on: the finding is of step 2, and its message says so."""
    diagnosis = Diagnosis()
    for step, value in enumerate([0.1, 0.1, 0.6, 0.7, 0.8]):
        diagnosis.feed(step, {"ActivationStats": {"act": {"saturated": value, "type": "Tanh"}}})
    (finding,) = [f for f in diagnosis.findings if f.kind == "saturated_activations"]
    assert finding.step == 2
    assert finding.message.endswith("60% of its outputs are saturated (flat tails, almost no gradient) since step 2"), \
        finding.message
