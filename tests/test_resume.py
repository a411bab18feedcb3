"""Resuming: ``Cockpit.state_dict`` / ``load_state_dict`` give the record of the uninterrupted run.

The run compared is deterministic (float64, one thread of work per step, the Cockpit's own
seeded random numbers), so the resumed and the uninterrupted records are compared bit for
bit: the same computation on the same numbers.
"""

import json
import math

import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit, configuration, log, quantities, schedules
from cockpit_lite.budget import Budget
from cockpit_lite.diagnosis import Diagnosis
from cockpit_lite.quantities.bin_adaptation import GradAbsMax, ParamAbsMax

STEPS = 7


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).double()


def _batches(steps=STEPS, batch=8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (batch,), generator=g))
            for _ in range(steps)]


def _quantities():
    """Every stateful quantity (and two of plain SGD's), the histograms adapting their ranges."""
    chosen = [q for q in configuration("full") if q.name not in ("GradHist1d", "GradHist2d")]
    return chosen + [
        quantities.GradHist1d(bins=8, adapt=GradAbsMax(schedules.linear(2))),
        quantities.GradHist2d(bins=(4, 5), adapt=(GradAbsMax(schedules.linear(3)), ParamAbsMax(schedules.linear(2)))),
        quantities.EarlyStopping(), quantities.CABS(),
    ]


def _train(model, opt, cp, batches, steps):
    for step in steps:
        x, y = batches[step]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward(create_graph=cp.create_graph(step))
        opt.step()


def _text(value):
    """A record (or part) as canonical JSON text: equal text is equal values, bit for bit (NaN included)."""
    return json.dumps(log.to_jsonable(value), sort_keys=True)


def _fresh(log_path, **kwargs):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    return model, opt, Cockpit(model, quantities=_quantities(), log=log_path, **kwargs)


@pytest.mark.parametrize("samples", [None, 3], ids=["exact", "samples=3"])
@pytest.mark.parametrize("split", [3, 5])
def test_a_resumed_run_records_what_the_uninterrupted_run_records(tmp_path, split, samples):
    batches = _batches()
    model, opt, whole = _fresh(tmp_path / "whole.jsonl", samples=samples)
    _train(model, opt, whole, batches, range(STEPS))
    whole.close()

    model, opt, first = _fresh(tmp_path / "resumed.jsonl", samples=samples)
    _train(model, opt, first, batches, range(split))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "cockpit": first.state_dict()},
               tmp_path / "checkpoint.pt")
    _train(model, opt, first, batches, range(split, split + 1))  # the saved run went on a step, then died
    del model, opt, first

    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    model, opt, resumed = _fresh(tmp_path / "resumed.jsonl", samples=samples)
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    resumed.load_state_dict(checkpoint["cockpit"])
    _train(model, opt, resumed, batches, range(split, STEPS))
    resumed.close()

    expected, got = whole.get_output(), resumed.get_output()
    assert min(s for s in got if "Loss" in got[s]) == split - 1  # the record goes on from the saved last step
    assert _text({s: e for s, e in got.items() if s >= split - 1}) == _text(
        {s: e for s, e in expected.items() if s >= split - 1})
    for step in (s for s in got if s < split - 1):  # findings found later, at the step they began
        assert _text(got[step]) == _text({k: expected[step][k] for k in got[step]})
    assert math.isfinite(resumed.get_output()[STEPS - 1]["Distance"][0])
    assert resumed.get_output()[STEPS - 1]["Distance"] == whole.get_output()[STEPS - 1]["Distance"]  # θ₀ carried
    assert _text([f.to_dict() for f in resumed.findings]) == _text([f.to_dict() for f in whole.findings])
    header, record = log.read_jsonl(tmp_path / "resumed.jsonl")
    assert _text(record) == _text(log.read(tmp_path / "whole.jsonl"))  # one run: the same record as the whole
    assert header["resumed"] is True and header["resumed_after"] == split - 1
    assert len(log.segments(tmp_path / "resumed.jsonl")) == 1


def test_the_state_dict_is_plain_tensors_and_python_values(tmp_path):
    model, opt, cp = _fresh(None)
    _train(model, opt, cp, _batches(3), range(3))
    torch.save(cp.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert state["format"] == "cockpit-lite state" and state["version"] == 1
    assert set(state["quantities"]) == {q.name for q in cp.quantities}
    assert [torch.equal(a, b) for a, b in zip(state["quantities"]["Distance"]["_initial"],
                                             cp.quantities[1]._initial)] == [True] * 4
    assert state["quantities"]["Alpha"]["_start"]["params"] == [{"__param__": i} for i in range(4)]


def test_the_diagnosis_goes_on_where_it_was_and_reports_no_finding_twice():
    def entry(step):
        return {"Loss": 1.0, "GradNorm": [0.01, 0.01], "GradVariance": [1.0, 1.0], "batch": {"size": 8}}

    whole = Diagnosis(["w", "b"], [(3, 2), (3,)])
    for step in range(12):
        whole.feed(step, entry(step))
    assert [f.kind for f in whole.findings].count("noise_dominates") == 1
    for split in range(1, 12):
        first = Diagnosis(["w", "b"], [(3, 2), (3,)])
        for step in range(split):
            first.feed(step, entry(step))
        resumed = Diagnosis(["w", "b"], [(3, 2), (3,)])
        resumed.load_state_dict(first.state_dict())
        for step in range(split, 12):
            resumed.feed(step, entry(step))
        assert [f.to_dict() for f in resumed.findings] == [f.to_dict() for f in whole.findings], split


def test_the_budget_keeps_its_plan(tmp_path):
    batches = _batches(60, batch=4)

    def fresh():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        cp = Cockpit(model, quantities=[quantities.GradNorm(), quantities.NormTest()], diagnose=False,
                     budget=Budget(1.5, horizon=1000))
        return model, opt, cp

    model, opt, first = fresh()
    steps = 0
    while first.budget.plan is None:
        _train(model, opt, first, batches, [steps])
        steps += 1
    state = first.state_dict()
    model, opt, resumed = fresh()
    resumed.load_state_dict(state)
    assert resumed.budget.plan == first.budget.plan
    for step in range(steps, 200):
        assert [q.is_due(step) for q in resumed.quantities] == [q.is_due(step) for q in first.quantities]
    _train(model, opt, resumed, batches, range(steps, steps + 2))
    assert all("budget" not in entry for step, entry in resumed.get_output().items() if step >= steps)


def test_bad_states_raise_a_value_error_naming_the_fix(tmp_path):
    model, opt, cp = _fresh(None)
    _train(model, opt, cp, _batches(2), range(2))
    state = cp.state_dict()

    def fresh(**kwargs):
        return Cockpit(_model(), quantities=kwargs.pop("quantities", _quantities()), **kwargs)

    with pytest.raises(ValueError, match="same quantities"):
        fresh(quantities=[quantities.Loss()]).load_state_dict(state)
    other = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    with pytest.raises(ValueError, match=r"position 0: saved \['0.weight', \[5, 6\]\].*same model"):
        Cockpit(other, quantities=_quantities()).load_state_dict(state)
    with pytest.raises(ValueError, match="version 2.*version that saved it"):
        fresh().load_state_dict({**state, "version": 2})
    with pytest.raises(ValueError, match="not the model's or the optimizer's"):
        fresh().load_state_dict(model.state_dict())
    with pytest.raises(ValueError, match="no budget.*budget="):
        fresh(budget=1.5).load_state_dict(state)
    with pytest.raises(ValueError, match=r"Distance: the saved state holds \['other'\] but this version of "
                                         r"Distance keeps \['_initial'\].*version that saved"):
        broken = {**state, "quantities": {**state["quantities"], "Distance": {"other": 1}}}
        fresh().load_state_dict(broken)
    with pytest.raises(ValueError, match="Distance: the saved state holds list but.*version that saved"):
        fresh().load_state_dict({**state, "quantities": {**state["quantities"], "Distance": [1]}})
    model, opt, used = _fresh(None)
    _train(model, opt, used, _batches(1), range(1))
    with pytest.raises(ValueError, match="recorded steps already.*new Cockpit"):
        used.load_state_dict(state)


def test_saving_inside_a_step_raises(tmp_path):
    model, opt, cp = _fresh(None)
    x, y = _batches(1)[0]
    loss = nn.functional.cross_entropy(model(x), y)
    with pytest.raises(ValueError, match="save between steps"):
        with cp(0, info={"loss": loss, "optimizer": opt}):
            loss.backward()
            cp.state_dict()


def test_a_quantity_state_that_no_state_dict_can_hold_is_named():
    class Keeps(quantities.Loss):
        STATE = ("_thing",)

        def __init__(self):
            super().__init__()
            self._thing = object()

    cp = Cockpit(_model(), quantities=[Keeps()], diagnose=False)
    with pytest.raises(ValueError, match=r"\['Keeps'\]\['_thing'\] holds a object"):
        cp.state_dict()


def test_a_generator_saved_on_another_device_type_names_the_fix():
    cp = Cockpit(_model(), quantities=[quantities.HessMaxEV()], diagnose=False)
    state = cp.state_dict()
    saved = {"__generator__": torch.Generator().get_state(), "device": "cuda"}
    state["quantities"]["HessMaxEV"] = {"_previous": None, "_generator": saved}
    with pytest.raises(ValueError, match="generator of a cuda device.*resume with the model on a cuda device"):
        Cockpit(_model(), quantities=[quantities.HessMaxEV()], diagnose=False).load_state_dict(state)


def test_another_rank_loads_rank_0s_state():
    """Lightning saves rank 0's callback state only; the other ranks (the diagnosis signals of their samples,
    no record, no diagnosis) load it."""
    from types import SimpleNamespace

    model, opt, cp = _fresh(None)
    _train(model, opt, cp, _batches(2), range(2))
    other = Cockpit(_model(), quantities=_quantities())
    other.group = SimpleNamespace(main=False, sharded=False)  # what a rank other than 0 is (under DDP)
    other._diagnosis = None
    other.load_state_dict(cp.state_dict())
    assert other.get_output() == {} and other._last_step == 1 and other._diagnosis is None
    assert torch.equal(other.quantities[1]._initial[0], cp.quantities[1]._initial[0])


def test_signals_read_by_forward_hooks_know_the_resumed_step():
    """ActivationStats and InputStats decide in the forward pass, before cp(step), whether the step is due."""
    def odd(step):
        return step % 2 == 1  # step 0, a fresh quantity's guess, is not due

    def fresh():
        model = _model()
        qs = [quantities.ActivationStats(track_schedule=odd), quantities.InputStats(track_schedule=odd)]
        return model, torch.optim.SGD(model.parameters(), lr=0.1), Cockpit(model, quantities=qs, diagnose=False)

    batches = _batches(5)
    model, opt, first = fresh()
    _train(model, opt, first, batches, range(3))
    state, weights = first.state_dict(), {k: v.clone() for k, v in model.state_dict().items()}
    _train(model, opt, first, batches, range(3, 5))
    model, opt, resumed = fresh()
    model.load_state_dict(weights)
    resumed.load_state_dict(state)
    _train(model, opt, resumed, batches, range(3, 4))
    assert _text(resumed.get_output()[3]) == _text(first.get_output()[3]) and "ActivationStats" in first.get_output()[3]
