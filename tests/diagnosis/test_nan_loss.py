"""``nan_loss`` on hand-made records: a non-finite ``Loss`` is found with or without the
``nonfinite_loss`` flag (a log written by another tool has no flags), once."""

import math

import pytest

from cockpit_lite.diagnosis import Diagnosis


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_loss_without_a_flag_is_found_at_its_step(bad):
    diagnosis = Diagnosis()
    for step, loss in enumerate([2.3, 2.2, bad, bad]):
        diagnosis.feed(step, {"Loss": loss})
    (finding,) = [f for f in diagnosis.findings if f.kind == "nan_loss"]
    assert finding.step == 2 and finding.layer is None
    assert finding.message == f"the loss is {bad} at step 2: the first non-finite value appeared (origin not tracked)"


def test_a_null_loss_in_a_log_is_found_as_non_finite_and_ends_the_diagnosis():
    """A tool that writes NaN as JSON null (pandas' ``to_json``): the history takes the null loss of step 2 as
    non-finite and feeds the rules no later step, so ``nan_loss`` must report it (before, nothing was found)."""
    diagnosis = Diagnosis()
    for step, loss in enumerate([2.3, 2.2, None, 2.1]):
        diagnosis.feed(step, {"Loss": loss})
    (finding,) = [f for f in diagnosis.findings if f.kind == "nan_loss"]
    assert finding.step == 2 and finding.message.startswith("the loss is non-finite at step 2")


def test_a_record_without_a_loss_is_not_a_non_finite_one():
    diagnosis = Diagnosis()
    for step in range(4):
        diagnosis.feed(step, {"Loss": 2.3} if step % 2 else {"GradNorm": [1.0, 1.0]})
    assert not [f for f in diagnosis.findings if f.kind == "nan_loss"]


@pytest.mark.parametrize("origin, layer, where, fix", [
    ({"module": "head", "op": "log"}, "head", "first in the output of 'head', made by 'log'", "clamp the argument of log"),
    ({"op": "exp"}, None, "in a forward pass no hook watched (its module is unknown), made by 'exp'", "logsumexp"),
    ({"module": "input", "op": "input"}, None, "in the model's input", "clean the data"),
    ({"module": "head", "op": "mul", "params_nonfinite": True}, "head", "first in the output of 'head', made by 'mul'",
     "an earlier update diverged"),
    ({"module": "loss_fn", "op": "mul"}, "loss_fn", "in the loss function, made by 'mul'",
     "find the operation named here and guard its argument"),
])
def test_the_origin_names_the_layer_the_op_and_its_fix(origin, layer, where, fix):
    diagnosis = Diagnosis()
    diagnosis.feed(0, {"Loss": math.nan, "NonfiniteOrigin": origin})
    (finding,) = [f for f in diagnosis.findings if f.kind == "nan_loss"]
    assert finding.layer == layer and finding.message.endswith(f"appeared {where}") and fix in finding.suggestion, \
        finding.message
    assert finding.evidence == {"module": origin.get("module"), "op": origin.get("op"),
                                "params_nonfinite": bool(origin.get("params_nonfinite"))}
