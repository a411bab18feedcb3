"""The overhead budget: calibrated against bare steps, spends only what the steps so far have
earned, re-plans from what it measured, and every plan is recorded and replays.

The budget is driven here by a fake clock: each step's period (from one ``cp(step)`` call to
the next) is what a run with the given plain step, untracked overhead and tier costs would
take, so nothing here depends on the machine's speed or load."""

import json
import random

import pytest
import torch

import problems
from cockpit_lite import Cockpit, configuration, diagnosis
from cockpit_lite.budget import (
    CHECK, PAIRS, PER_OCTAVE, PRIOR, PROBE, STEPS, TIERS, WARMUP, Budget, _candidate, expected_tier, octave_steps, plans, tier_of,
)
from cockpit_lite.quantities.base import Needs
from cockpit_lite.engine.transforms import SumGradSquared


class _Named:
    """A stand-in quantity: a name and the tier it declares."""

    def __init__(self, name, tier):
        self.name, self.TIER = name, tier


NEEDS = {0: Needs(), 1: Needs(transforms=(SumGradSquared(),)), 2: Needs(hvp=True)}
QUANTITIES = {"Loss": 0, "NormTest": 1, "HessMaxEV": 2}


class Clock:
    """Drives a budget through ``steps`` steps of a simulated run and returns its periods.

    A bare step takes ``plain`` seconds and ``own`` more, its ``cp(step)`` call (told to the budget
    where ``tell``), an untracked one ``plain · (1 + u)``, a step whose top tier is ``k``
    ``plain · (1 + u + costs[k])`` (``costs``: plain steps, a function of the step where given one);
    ``plain`` may be a function of the step too (the step time changes).
    """

    def __init__(self, plain=0.01, u=0.1, costs=(0.5, 6.0, 40.0), noise=0.0, seed=0, own=0.0, tell=True):
        self.plain, self.u, self.costs, self.noise, self.own, self.tell = plain, u, costs, noise, own, tell
        self.rng = random.Random(seed)

    def period(self, budget, step):
        plain = self.plain(step) if callable(self.plain) else self.plain
        if budget.bare(step):
            if self.tell:
                budget.took(step, self.own)
            return (plain + self.own) * (1 + self.noise * self.rng.uniform(-1, 1))
        else:
            top = budget.top(step)
            cost = 0.0 if top is None else (self.costs(step)[top] if callable(self.costs) else self.costs[top])
            factor = 1 + self.u + cost
        return plain * factor * (1 + self.noise * self.rng.uniform(-1, 1))

    def run(self, budget, steps, tiers=None):
        """The periods of ``steps`` steps and the plans made (what the Cockpit records); ``tiers``:
        the tiers of the Needs the quantities show when due (default: as planned)."""
        now, periods, made = 0.0, [], []
        for step in range(steps):
            plan = budget.step_started(step, now)
            if plan is not None:
                made.append(plan)
            due = [(_Named(name, None), NEEDS[(tiers or budget.tiers)[name]]) for name in budget.names
                   if budget.tiers[name] <= (budget.top(step) if budget.top(step) is not None else -1)]
            budget.saw(step, due)
            periods.append(self.period(budget, step))
            now += periods[-1]
        return periods, made


def _budget(factor=1.25, quantities=QUANTITIES, **kwargs):
    budget = Budget(factor, **kwargs)
    budget.take_over([_Named(n, t) for n, t in quantities.items()])
    return budget


def _averages(periods, plain):
    """The average step time over every prefix, in plain steps."""
    total, out = 0.0, []
    for n, period in enumerate(periods, 1):
        total += period
        out.append(total / (n * plain))
    return out


@pytest.mark.parametrize("m", PER_OCTAVE)
def test_candidates_are_the_logarithmic_steps(m):
    steps = set(octave_steps(m, 0, 5000))
    assert {t for t in range(5000) if _candidate(m, t)} == steps
    assert {1, 256, 4096} <= steps
    assert m < 1 or {2, 4, 1024} <= steps
    assert len(octave_steps(m, 2**8, 2**16)) == 8 * m  # m steps per octave


def test_tiers_come_from_what_a_quantity_needs():
    assert tier_of(None) == 0 and tier_of(Needs()) == 0
    assert tier_of(Needs(transforms=(SumGradSquared(),))) == 1
    assert tier_of(Needs(transforms=(SumGradSquared(),), hvp=True)) == 2
    assert tier_of(Needs(extensions=(object(),))) == 2
    assert tier_of(Needs(transforms=(SumGradSquared(),), diagonals=(object(),))) == 2  # the engine's GGN passes


def test_the_tier_a_quantity_is_planned_in_is_the_one_its_needs_show():
    """Every quantity of ``full`` and every diagnosis signal: the tier planned before it was due
    (declared, or read from TRANSFORMS) is the tier of its Needs at a due step."""
    problem = problems.make("cnn", 4, steps=1)
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.01)
    cp = Cockpit(problem.model, configuration("full"))
    x, y = problem.batches[0]
    loss = problem.lossfunc(problem.model(x), y)
    with cp(0, info={"loss": loss, "optimizer": opt}) as context:
        loss.backward()
    opt.step()
    cp.close()
    shown = {q.name: tier_of(n) for q, n in context.due}
    assert set(shown) >= {q.name for q in configuration("full")} | {"ActivationStats", "GradPresence"}
    assert {name: expected_tier(q) for q in cp.quantities if (name := q.name) in shown} == shown


def test_calibration_times_bare_steps_as_the_plain_step_and_counts_the_untracked_overhead():
    budget = _budget()
    clock = Clock(plain=0.01, u=0.2)
    periods, made = clock.run(budget, WARMUP + STEPS)
    bare = [t for t in range(WARMUP + STEPS) if budget.bare(t)]
    assert bare == [WARMUP + i for i in range(STEPS) if i % 4 < 2]
    (plan,) = made
    assert plan["step"] == WARMUP + STEPS - 1
    assert plan["plain_step_s"] == pytest.approx(0.01) and plan["untracked_cost"] == pytest.approx(0.2)
    # what was earned over the calibration, less what its periods are charged (the first two as
    # measured, the bare ones nothing, the others u), and what the two steps before the plan governs
    # earn (idle steps are bare: only the probes' untracked ones cost u)
    charged = 0.2 * (len(periods) - 1 - PAIRS)
    ahead = 2 * (0.25 - 2 * 0.2 / PROBE)
    assert sum(plan["accounts"].values()) == pytest.approx(0.25 * plan["step"] - charged + ahead)
    assert plan["costs"] == dict(zip(TIERS, PRIOR)) and not any(plan["measured"].values())


@pytest.mark.parametrize("seed", range(8))
def test_the_average_holds_over_every_prefix_when_the_costs_are_known(seed):
    """Costs at or below their priors: the average step time, counted from the first step to
    any step after the first plan, never exceeds the factor."""
    rng = random.Random(seed)
    factor = rng.choice((1.1, 1.25, 1.5))
    costs = (rng.uniform(0, PRIOR[0]), rng.uniform(PRIOR[0], PRIOR[1]), rng.uniform(PRIOR[1], PRIOR[2]))
    clock = Clock(plain=0.004, u=rng.uniform(0, factor - 1), costs=costs, seed=seed)
    budget = _budget(factor)
    periods, made = clock.run(budget, 3000)
    averages = _averages(periods, 0.004)
    assert max(averages[made[0]["step"]:]) <= factor + 1e-9
    assert averages[-1] > 1 + 0.3 * (factor - 1)  # and the budget is used, not left idle


@pytest.mark.parametrize("factor", (1.1, 1.25))
def test_the_cockpits_own_call_at_bare_steps_is_charged_not_taken_for_the_plain_step(factor):
    """A sub-millisecond step (0.4 ms), whose bare steps' ``cp(step)`` calls take 30 µs: the plain step
    is the bare period less that call, and every prefix's average holds over the plain step; counted as
    part of the plain step (not told), the calls and what the budget spends on top overshoot."""
    averages = {}
    for tell in (True, False):
        budget = _budget(factor)
        clock = Clock(plain=4e-4, u=0.1, costs=(1.0, 6.0, 40.0), own=3e-5, tell=tell)
        periods, made = clock.run(budget, 3000)
        averages[tell] = _averages(periods, 4e-4)[made[0]["step"]:]
        if tell:
            assert made[-1]["plain_step_s"] == pytest.approx(4e-4) and made[-1]["bare_cost"] == pytest.approx(0.075)
    assert max(averages[True]) <= factor + 1e-9 < max(averages[False])
    assert averages[True][-1] > 1 + 0.3 * (factor - 1)  # (and the rest is spent)


def test_a_tier_dearer_than_its_prior_overshoots_once_then_waits_until_it_is_earned_back():
    costs = (0.5, 6.0, 2 * PRIOR[2])
    clock = Clock(plain=0.01, u=0.05, costs=costs)
    budget = _budget(1.5)
    periods, made = clock.run(budget, 4000)
    curvature = [t for t in range(4000) if budget.top(t) == 2]
    assert len(curvature) >= 2
    averages = _averages(periods, 0.01)
    first = curvature[0]
    assert averages[first] > 1.5  # the prior was too low
    repaid = next(n for n in range(first, 4000) if averages[n] <= 1.5)
    replan = next(p["step"] for p in made if p["step"] > first)  # (the step its measurement ends)
    assert first < replan <= first + PROBE and repaid > replan + 100  # (a probe may come first)
    assert all(budget.top(t) is None for t in range(replan + 2, repaid - 1))  # nothing ran meanwhile
    assert max(averages[curvature[1] - 1:]) <= 1.5 + 1e-9  # measured since: planned as it is
    measured = next(p for p in made if p["measured"]["curvature"])
    assert measured["costs"]["curvature"] == pytest.approx(costs[2], abs=4 * 0.05)  # (and its untracked neighbours)


def test_idle_steps_are_bare_so_an_untracked_overhead_beyond_the_budget_is_not_paid_on_them():
    budget = _budget(1.25)
    periods, made = Clock(u=0.4, costs=(0.5, 6.0, 40.0)).run(budget, 2000)
    averages = _averages(periods, 0.01)
    assert max(averages[made[0]["step"]:]) <= 1.25 + 1e-9
    assert any(budget.top(t) == 2 for t in range(2000))
    idle = [t for t in range(made[0]["step"] + 2, 2000) if all(budget.top(s) is None for s in range(t - 2, t + 2))]
    assert all(budget.bare(t) for t in idle if t % PROBE >= 4)


def test_an_untracked_overhead_the_probes_alone_exceed_warns_and_tracks_nothing():
    budget = _budget(1.25)
    with pytest.warns(UserWarning, match="untracked steps cost 8.00x"):
        Clock(u=7.0).run(budget, 300)
    assert all(budget.top(t) is None for t in range(300))


def test_a_quantity_whose_needs_show_another_tier_is_re_planned():
    budget = _budget(quantities={"Loss": 0, "Sneaky": 0})
    shown = {"Loss": 0, "Sneaky": 2}
    _, made = Clock().run(budget, 200, tiers=shown)
    first_due = min(t for t in range(200) if budget.top(t) == 0)
    replan = next(p for p in made if p["tiers"]["Sneaky"] == 2)
    assert replan["step"] == first_due + 1
    assert replan["bought"]["curvature"] == ["Sneaky"]


def test_a_changed_step_time_calibrates_again_and_re_plans():
    clock = Clock(plain=lambda t: 0.01 if t < 400 else 0.03, u=0.1)
    budget = _budget()
    _, made = clock.run(budget, 1000)
    again = next(p for p in made if p["recalibrate"] is not None)
    assert again["step"] % CHECK == 3 and again["step"] > 400  # (100k, 100k + 1: a probe's bare steps; 100k + 2 its untracked one)
    window = range(again["step"] + 2, again["recalibrate"] + STEPS)
    assert all(budget.top(t) is None for t in window)  # nothing due while it calibrates
    pattern = [budget.bare(again["recalibrate"] + i) for i in range(STEPS)]
    assert pattern == [i % 4 < 2 for i in range(STEPS)]  # pairs of bare steps, pairs of untracked ones
    new = next(p for p in made if p["step"] == again["recalibrate"] + STEPS - 1)
    assert new["plain_step_s"] == pytest.approx(0.03) and new["untracked_cost"] == pytest.approx(0.1)
    assert not any(p["recalibrate"] for p in made if p["step"] > new["step"])  # calm again


def test_the_recorded_plans_replay_the_schedules_without_measuring():
    clock = Clock(plain=lambda t: 0.01 if t < 700 else 0.02, noise=0.3, seed=3)
    budget = _budget()
    _, made = clock.run(budget, 1500)
    assert any(p["recalibrate"] for p in made) and any(p["measured"]["bookkeeping"] for p in made)
    record = json.loads(json.dumps({p["step"]: {"budget": p} for p in made}))  # as a log stores them
    replay = _budget(plan=plans({int(step): entry for step, entry in record.items()}))
    for step in range(1500):
        replay.step_started(step, 0.0)  # (a replay reads no clock)
        assert (replay.top(step), replay.bare(step)) == (budget.top(step), budget.bare(step)), step
        if replay.bare(step):
            replay.took(step, 1e-5)
    assert not replay._own  # (nor keeps the calls' times: a long replayed run would hold one per bare step)


def test_a_long_run_keeps_only_its_due_steps():
    """The schedules of the steps past (``top``) stay answerable, held as the steps where a tier is due."""
    budget = _budget()
    Clock(plain=0.001, u=0.05, costs=(1.0, 6.0, 40.0)).run(budget, 20000)
    due = [t for t in range(20000) if budget.top(t) is not None]
    assert 0 < len(due) < 2000 and len(budget._tops) <= len(due) + 1


def test_bad_factor_names_it():
    with pytest.raises(ValueError, match="must exceed 1"):
        Budget(1.0)


def test_a_plan_of_another_format_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="plans\\(record\\)"):
        Budget(plan={"factor": 1.25, "horizon": 500, "schedules": {}})


def _run(problem, steps, budget, log=None, first=0, diagnose=False, hook=None):
    opt = torch.optim.SGD(problem.model.parameters(), lr=0.01)
    cp = Cockpit(problem.model, configuration("business"), budget=budget, diagnose=diagnose, log=log)
    x, y = problem.batches[0]
    for step in range(first, first + steps):
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
        if hook is not None:
            hook(cp, step)
    cp.close()
    return cp


def _steps_of(record):
    names = {k for entry in record.values() for k in entry} - {"layers", "meta", "batch", "budget", "flags"}
    return {n: sorted(s for s, e in record.items() if n in e) for n in names}


def test_plans_are_recorded_in_the_log_and_replay_the_run(tmp_path):
    problem = problems.make("mlp", 4, steps=1)
    path = tmp_path / "run.jsonl"
    cp = _run(problem, 120, Budget(50.0, horizon=200), log=path)  # (a budget any machine keeps buying with)
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    logged = [line["budget"] for line in lines if "budget" in line]
    assert logged[0]["step"] == WARMUP + STEPS - 1 and logged == plans(cp.get_output())
    steps = _steps_of(cp.get_output())
    assert steps  # something was bought
    replay = _run(problems.make("mlp", 4, steps=1), 120, Budget(plan=logged))
    assert _steps_of(replay.get_output()) == steps


def test_bare_steps_take_the_cockpits_hooks_off_and_put_them_back_in_order():
    problem = problems.make("mlp", 4, steps=1)
    seen = []
    problem.model[0].register_forward_hook(lambda *args: seen.append(1))  # the user's own hook
    orders = {}

    def look(cp, step):  # the hooks the next forward pass meets: (the Cockpit's?) in order, per module
        orders[step] = [[(key, hook.__module__.startswith("cockpit_lite")) for hooks in (m._forward_pre_hooks, m._forward_hooks)
                         for key, hook in hooks.items()] for m in problem.model.modules()]

    _run(problem, WARMUP + STEPS + 2, Budget(1.5), diagnose=True, hook=look)
    assert len(seen) == WARMUP + STEPS + 2  # the user's hook ran at every step, bare ones too
    before = orders[WARMUP - 2]
    assert any(ours for hooks in before for _, ours in hooks)
    for i in range(STEPS):  # the forward pass of step WARMUP + i: bare when that step is
        bare = i % 4 < 2
        assert orders[WARMUP + i - 1] == ([[h for h in hooks if not h[1]] for hooks in before] if bare else before)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_parameters_are_those_without_a_cockpit_bit_for_bit():
    problem, twin = problems.make("mlp", 4, steps=1), problems.make("mlp", 4, steps=1)
    _run(problem, 60, Budget(1.5), diagnose=True)
    opt = torch.optim.SGD(twin.model.parameters(), lr=0.01)
    x, y = twin.batches[0]
    for _ in range(60):
        opt.zero_grad()
        twin.lossfunc(twin.model(x), y).backward()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(problem.model.parameters(), twin.model.parameters()))


def test_a_resumed_run_without_its_state_calibrates_from_its_first_step():
    first = 1000
    cp = _run(problems.make("mlp", 4, steps=1), WARMUP + STEPS, Budget(1.5, horizon=200), first=first)
    (plan, *_) = plans(cp.get_output())
    assert cp.budget.origin == first and plan["origin"] == first and plan["step"] == first + WARMUP + STEPS - 1


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


def test_the_diagnosis_signals_are_budgeted_too():
    cp = _run(problems.make("mlp", 4, steps=1), WARMUP + STEPS, Budget(1.5), diagnose=True)
    signals = {name for name in diagnosis.SIGNALS if name in cp.budget.tiers}
    assert signals and all(cp.budget.tiers[name] == 0 for name in signals)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # (BackPACK's, on the twin: the problems are extended)
@pytest.mark.parametrize("kind", ["parameters", "accumulate"])
def test_bare_steps_with_parameters_only_and_under_gradient_accumulation(kind):
    """Every micro-batch of a bare step is bare; a Cockpit given parameters finds its model at a
    step that is not bare. Training is untouched, and no hook of the Cockpit stays after close."""
    problem, twin = problems.make("mlp", 4, steps=1), problems.make("mlp", 4, steps=1)
    opt, twin_opt = (torch.optim.SGD(p.model.parameters(), lr=0.01) for p in (problem, twin))
    cp = (Cockpit(problem.model.parameters(), configuration("full"), budget=Budget(20.0)) if kind == "parameters"
          else Cockpit(problem.model, configuration("full"), budget=Budget(20.0), accumulate=True))
    x, y = problem.batches[0]
    for step in range(WARMUP + STEPS + 2 * PROBE):
        opt.zero_grad()
        twin_opt.zero_grad()
        for part in ((slice(0, 2), slice(2, 4)) if kind == "accumulate" else (slice(0, 4),)):
            loss = problem.lossfunc(problem.model(x[part]), y[part])
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            twin.lossfunc(twin.model(x[part]), y[part]).backward()
        opt.step()
        twin_opt.step()
    cp.close()
    assert all(torch.equal(a, b) for a, b in zip(problem.model.parameters(), twin.model.parameters()))
    assert any(cp.budget.bare(t) for t in range(WARMUP + STEPS, step))
    assert not [h for m in problem.model.modules() for h in (*m._forward_pre_hooks.values(), *m._forward_hooks.values())
                if h.__module__.startswith("cockpit_lite")] and not opt._optimizer_step_post_hooks
