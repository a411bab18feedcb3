"""The overhead budget: deterministic plan from its calibration, recorded, replayable."""

import json

import pytest
import torch

import problems
from cockpit_lite import Cockpit, configuration
from cockpit_lite.budget import PER_OCTAVE, Budget, _due, octave_steps


class _Named:
    def __init__(self, name):
        self.name = name


def _budget(names, factor=1.25, horizon=500):
    budget = Budget(factor, horizon)
    quantities = [_Named(n) for n in names]
    budget.take_over(quantities)
    return budget, quantities


def _periods(budget, plain, costs):
    """Calibration periods of a run whose quantity ``name`` costs ``costs[name]`` plain steps."""
    periods = {t: plain for t in range(budget.start - 1)}
    periods[0] = plain * 1.5  # a slow first step (warm-up) does not count as the plain step
    for name, cost in costs.items():
        periods[budget.calibration_step(name)] = plain * (1 + cost)
    return periods


@pytest.mark.parametrize("m", (1, *PER_OCTAVE))
def test_due_agrees_with_the_counted_steps(m):
    steps = set(octave_steps(m, 0, 5000))
    assert {t for t in range(5000) if _due({"per_octave": m, "from": 0}, t)} == steps
    assert {1, 2, 4, 1024, 4096} <= steps


def test_cheap_quantities_every_step_expensive_ones_logarithmic_within_budget():
    budget, _ = _budget(["Loss", "GradNorm", "HessTrace", "HessMaxEV"])
    costs = {"Loss": 0.01, "GradNorm": 0.02, "HessTrace": 2.0, "HessMaxEV": 10.0}
    plan = budget.schedule_from(_periods(budget, 0.01, costs))
    schedules = plan["schedules"]
    assert schedules["Loss"] == {"every": 1, "from": budget.start}
    assert schedules["GradNorm"] == {"every": 1, "from": budget.start}
    assert "per_octave" in schedules["HessMaxEV"] and "per_octave" in schedules["HessTrace"]
    assert schedules["HessTrace"]["per_octave"] >= schedules["HessMaxEV"]["per_octave"]
    assert plan["expected_ratio"] <= 1.25
    for name, cost in costs.items():
        assert plan["costs"][name] == pytest.approx(cost)
    # the expected ratio is what the schedules cost: recount it
    total = sum(costs.values())
    for name, rule in schedules.items():
        total += costs[name] * sum(_due(rule, t) for t in range(budget.start, 500))
    assert plan["expected_ratio"] == pytest.approx(1 + total / 500)


def test_plan_is_deterministic_given_the_calibration():
    names = ["Loss", "NormTest", "HessMaxEV"]
    costs = {"Loss": 0.1, "NormTest": 1.0, "HessMaxEV": 20.0}
    plans = []
    for _ in range(2):
        budget, _ = _budget(names)
        plans.append(budget.schedule_from(_periods(budget, 0.003, costs)))
    assert plans[0] == plans[1]


def test_an_infeasible_budget_warns_and_keeps_one_value_per_octave():
    budget, _ = _budget(["HessMaxEV"], factor=1.01, horizon=100)
    with pytest.warns(UserWarning, match="cannot be kept"):
        plan = budget.schedule_from(_periods(budget, 0.01, {"HessMaxEV": 100.0}))
    assert plan["schedules"]["HessMaxEV"] == {"per_octave": 1, "from": budget.start}


def test_bad_factor_names_it():
    with pytest.raises(ValueError, match="must exceed 1"):
        Budget(1.0)


def _run(problem, steps, budget, log=None):
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.01)
    cp = Cockpit(problem.model, configuration("business"), budget=budget, diagnose=False, log=log)
    x, y = problem.batches[0]
    for step in range(steps):
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward(create_graph=cp.create_graph(step))
        opt.step()
    cp.close()
    return cp


def _steps_of(record):
    names = {k for entry in record.values() for k in entry} - {"layers", "meta", "batch", "budget", "flags"}
    return {n: sorted(s for s, e in record.items() if n in e) for n in names}


def test_plan_is_recorded_in_the_log_and_replays_the_schedule(tmp_path):
    problem = problems.make("mlp", 4, steps=1)
    path = tmp_path / "run.jsonl"
    cp = _run(problem, 70, Budget(1.5, horizon=200), log=path)
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    plans = [line for line in lines if "budget" in line]
    assert len(plans) == 1 and plans[0]["step"] == cp.budget.start - 1
    plan = plans[0]["budget"]
    assert set(plan["schedules"]) == {q.name for q in cp.quantities}
    steps = _steps_of(cp.get_output())
    for name, rule in plan["schedules"].items():  # (two-step quantities record step 69 at step 70)
        calibration = {cp.budget.calibration_step(name)}
        expected = calibration | {t for t in range(cp.budget.start, 69) if _due(rule, t)}
        assert [t for t in steps[name] if t < 69] == sorted(expected)
    replay = _run(problems.make("mlp", 4, steps=1), 70, Budget(plan=plan))
    assert _steps_of(replay.get_output()) == steps
