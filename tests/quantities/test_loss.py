"""Loss against a recomputation of the mini-batch loss, on every first-order problem."""

import pytest

import problems
from cockpit_lite.quantities import Loss


def reference(problem, snapshots, step):
    return problems.loss(problem, snapshots[step])


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_recomputed_loss(case):
    problems.check(Loss(), reference, case, layers=False)


def _steps(quantity, infos):
    import torch
    from torch import nn

    from cockpit_lite import Cockpit

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    cp = Cockpit(model, [quantity], diagnose=False)
    losses = []
    for step, with_loss in enumerate(infos):
        loss = model(torch.randn(4, 3)).square().mean()
        losses.append(loss.item())
        with cp(step, info={"loss": loss} if with_loss else {}):
            loss.backward()
    return cp.output, losses


def test_a_missing_loss_raises_unless_not_required():
    with pytest.raises(ValueError, match=r"Loss needs info\['loss'\]"):
        _steps(Loss(), [False])
    output, losses = _steps(Loss(required=False), [True, False, True])
    assert {s: e["Loss"] for s, e in output.items() if "Loss" in e} == pytest.approx({0: losses[0], 2: losses[2]})


def test_schedule_and_verbose(capsys):
    output, losses = _steps(Loss(), [True, True])
    assert [output[s]["Loss"] for s in (0, 1)] == pytest.approx(losses)
    assert capsys.readouterr().out == ""
    output, losses = _steps(Loss(track_schedule=lambda s: s == 1, verbose=True), [True, True])
    assert [s for s in output if "Loss" in output[s]] == [1]
    assert capsys.readouterr().out.count("Loss") == 1
