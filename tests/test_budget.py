"""The overhead budget: deterministic plan from its calibration, recorded, replayable."""

import json

import pytest
import torch

import problems
from cockpit_lite import Cockpit, configuration
from cockpit_lite.budget import FIRST, PER_OCTAVE, RUN, SPACING, TIERS, Budget, _due, octave_steps, tier_of
from cockpit_lite.quantities.base import Needs
from cockpit_lite.engine.transforms import SumGradSquared


class _Named:
    def __init__(self, name):
        self.name = name


NEEDS = {0: Needs(), 1: Needs(transforms=(SumGradSquared(),)), 2: Needs(hvp=True)}


def _budget(tiers, factor=1.25, horizon=500):
    """A budget over quantities ``{name: tier}``, past its first calibration step."""
    budget = Budget(factor, horizon)
    quantities = [_Named(n) for n in tiers]
    budget.take_over(quantities)
    budget.step_started(0, 0.0)  # the first step entered: calibration counts from it
    budget.saw(FIRST, [(q, NEEDS[tiers[q.name]]) for q in quantities])
    return budget


def _periods(budget, plain, set_costs):
    """Calibration periods of a run whose calibration set ``i`` costs ``set_costs[i]`` plain steps."""
    periods = {t: plain for t in range(budget.start - 1)}
    periods[0] = periods[1] = plain * 1.5  # slow first steps (warm-up) do not count as the plain step
    sets, untracked = budget.calibration()
    periods[untracked[-2]] = plain * 1.1  # one slow untracked step does not count either (median)
    for (_, steps), cost in zip(sets, set_costs):
        for t in steps:
            periods[t] = plain * (1 + cost)
    return periods


def _recount(budget, plan):
    """The expected ratio recounted from the plan: calibration plus each step's due set."""
    costs = [plan["costs"][TIERS[t]] for t in range(len(TIERS)) if TIERS[t] in plan["costs"]]
    present = sorted(set(plan["tiers"].values()))
    total = plan["calibration_cost"]
    for t in range(budget.start, budget.horizon):
        due = {plan["tiers"][n] for n, rule in plan["schedules"].items() if _due(rule, t)}
        total += sum(cost for tier, cost in zip(present, costs) if tier in due)
    return 1 + total / budget.horizon


@pytest.mark.parametrize("m", PER_OCTAVE)
def test_due_agrees_with_the_counted_steps(m):
    steps = set(octave_steps(m, 0, 5000))
    assert {t for t in range(5000) if _due({"per_octave": m, "from": 0}, t)} == steps
    assert {1, 256, 4096} <= steps
    assert m < 1 or {2, 4, 1024} <= steps
    assert len(octave_steps(m, 2**8, 2**16)) == 8 * m  # m steps per octave


def test_tiers_come_from_what_a_quantity_needs():
    assert tier_of(None) == 0 and tier_of(Needs()) == 0
    assert tier_of(Needs(transforms=(SumGradSquared(),))) == 1
    assert tier_of(Needs(transforms=(SumGradSquared(),), hvp=True)) == 2
    assert tier_of(Needs(extensions=(object(),))) == 2
    assert tier_of(Needs(transforms=(SumGradSquared(),), diagonals=(object(),))) == 2  # the engine's GGN passes


def test_calibration_sets_are_nested_and_shared_work_is_measured_once():
    budget = _budget({"Loss": 0, "NormTest": 1, "HessTrace": 2, "HessMaxEV": 2})
    assert budget.levels == [2, 1, 0] and budget.start == FIRST + 2 * SPACING + 2 * RUN
    assert budget.calibration_steps("HessMaxEV") == [FIRST]
    assert budget.calibration_steps("NormTest") == [FIRST, FIRST + SPACING]
    bookkeeping = list(range(FIRST + 2 * SPACING, FIRST + 2 * SPACING + RUN))  # a run: it may go every step
    assert budget.calibration_steps("Loss") == [FIRST, FIRST + SPACING, *bookkeeping]
    # all due: 30 plain steps; tiers 0-1: 5; tier 0: 0.2 per step -> marginal costs 25, 4.8, 0.2
    plan = budget.schedule_from(_periods(budget, 0.01, [30.0, 5.0, 0.2]))
    assert plan["costs"] == pytest.approx({"curvature": 25.0, "per-sample": 4.8, "bookkeeping": 0.2})
    assert plan["calibration_cost"] == pytest.approx(35 + 0.2 * RUN)
    assert plan["plain_step_s"] == pytest.approx(0.01)


def test_cheap_tiers_dense_expensive_ones_logarithmic_within_budget():
    budget = _budget({"Loss": 0, "GradNorm": 0, "NormTest": 1, "HessTrace": 2, "HessMaxEV": 2})
    plan = budget.schedule_from(_periods(budget, 0.01, [12.0, 1.0, 0.02]))
    schedules = plan["schedules"]
    assert schedules["Loss"] == schedules["GradNorm"] == {"every": 1, "from": budget.start}
    assert schedules["HessTrace"] == schedules["HessMaxEV"]  # one tier, one schedule
    assert "per_octave" in schedules["HessMaxEV"]
    assert schedules["NormTest"] != schedules["HessMaxEV"]
    assert plan["expected_ratio"] <= 1.25
    assert plan["expected_ratio"] == pytest.approx(_recount(budget, plan))


@pytest.mark.filterwarnings("ignore:the overhead budget")
@pytest.mark.parametrize("seed", range(20))
def test_a_tier_is_never_denser_than_the_tier_below(seed):
    import random

    rng = random.Random(seed)
    budget = _budget({"A": 0, "B": 1, "C": 2}, factor=rng.uniform(1.05, 3.0), horizon=rng.choice((200, 500, 2000)))
    costs = sorted((rng.uniform(0, 50) for _ in range(3)), reverse=True)
    plan = budget.schedule_from(_periods(budget, 0.01, costs))
    due = {n: {t for t in range(budget.start, budget.horizon) if _due(rule, t)} for n, rule in plan["schedules"].items()}
    assert due["C"] <= due["B"] <= due["A"]
    assert plan["expected_ratio"] == pytest.approx(_recount(budget, plan))
    if plan["expected_ratio"] > budget.factor + 1e-9:  # only when even one value per octave does not fit
        assert all(rule == {"per_octave": PER_OCTAVE[-1], "from": budget.start} for rule in plan["schedules"].values())


def test_plan_is_deterministic_given_the_calibration():
    plans = []
    for _ in range(2):
        budget = _budget({"Loss": 0, "NormTest": 1, "HessMaxEV": 2})
        plans.append(budget.schedule_from(_periods(budget, 0.003, [20.0, 1.0, 0.1])))
    assert plans[0] == plans[1]


def test_an_infeasible_budget_warns_and_keeps_the_sparsest_logarithmic_schedule():
    budget = _budget({"HessMaxEV": 2}, factor=1.01, horizon=100)
    with pytest.warns(UserWarning, match="cannot be kept"):
        plan = budget.schedule_from(_periods(budget, 0.01, [100.0]))
    assert plan["schedules"]["HessMaxEV"] == {"per_octave": 0.25, "from": budget.start}


def test_bad_factor_names_it():
    with pytest.raises(ValueError, match="must exceed 1"):
        Budget(1.0)


def _run(problem, steps, budget, log=None, first=0):
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.01)
    cp = Cockpit(problem.model, configuration("business"), budget=budget, diagnose=False, log=log)
    x, y = problem.batches[0]
    for step in range(first, first + steps):
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
        calibration = set(cp.budget.calibration_steps(name))
        expected = calibration | {t for t in range(cp.budget.start, 69) if _due(rule, t)}
        assert [t for t in steps[name] if t < 69] == sorted(expected)
    replay = _run(problems.make("mlp", 4, steps=1), 70, Budget(plan=plan))
    assert _steps_of(replay.get_output()) == steps


def test_a_run_sorts_the_real_quantities_into_tiers_by_their_needs():
    cp = _run(problems.make("mlp", 4, steps=1), FIRST + 1, Budget(1.5, horizon=200))
    tiers = cp.budget.tiers
    assert tiers["Loss"] == tiers["GradNorm"] == tiers["Distance"] == 0
    assert tiers["NormTest"] == tiers["GradHist1d"] == tiers["Alpha"] == 1
    assert tiers["HessTrace"] == tiers["TICDiag"] == 2  # Hutchinson (graph) or BackPACK (extension)
    # the first calibration step records every quantity of the level at once
    assert {q.name for q in cp.quantities} - {"Alpha", "UpdateSize"} <= set(cp.get_output()[FIRST])


def test_a_resumed_run_calibrates_from_its_first_step():
    first = 1000
    cp = _run(problems.make("mlp", 4, steps=1), 40, Budget(1.5, horizon=200), first=first)
    record = cp.get_output()
    assert cp.budget.origin == first and cp.budget.start == first + 21
    assert {q.name for q in cp.quantities} - {"Alpha", "UpdateSize"} <= set(record[first + FIRST])
    plan = next(entry["budget"] for entry in record.values() if "budget" in entry)
    assert plan["origin"] == first
    steps = _steps_of(record)
    for name, rule in plan["schedules"].items():  # logarithmic in the global step; the horizon counts from the first
        expected = set(cp.budget.calibration_steps(name)) | {t for t in range(cp.budget.start, first + 39) if _due(rule, t)}
        assert [t for t in steps[name] if t < first + 39] == sorted(expected)


def test_steps_that_skip_during_calibration_get_an_error_naming_the_fix():
    problem = problems.make("mlp", 4, steps=1)
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.01)
    cp = Cockpit(problem.model, configuration("economy"), budget=1.5, diagnose=False)
    x, y = problem.batches[0]
    with pytest.raises(ValueError, match="consecutive step numbers"):
        for step in range(0, 60, 2):
            opt.zero_grad()
            loss = problem.lossfunc(problem.model(x), y)
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            opt.step()
