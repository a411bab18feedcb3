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
    assert finding.message.startswith(f"the loss is {bad} at step 2") and "(origin not tracked)" in finding.message


@pytest.mark.parametrize("origin, layer, where, fix", [
    ({"module": "head", "op": "log"}, "head", "first in the output of 'head', made by 'log'", "clamp the argument of log"),
    ({"op": "exp"}, None, "in a forward pass no hook watched (its module is unknown), made by 'exp'", "logsumexp"),
    ({"module": "input", "op": "input"}, None, "in the model's input", "clean the data"),
    ({"module": "head", "op": "mul", "params_nonfinite": True}, "head", "first in the output of 'head'",
     "an earlier update diverged"),
])
def test_the_origin_names_the_layer_the_op_and_its_fix(origin, layer, where, fix):
    diagnosis = Diagnosis()
    diagnosis.feed(0, {"Loss": math.nan, "NonfiniteOrigin": origin})
    (finding,) = [f for f in diagnosis.findings if f.kind == "nan_loss"]
    assert finding.layer == layer and f"appeared {where}" in finding.message and fix in finding.suggestion
