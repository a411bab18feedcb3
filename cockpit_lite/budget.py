"""An overhead budget: spacing out the expensive quantities so that a run stays cheap.

``Cockpit(model, configuration("full"), budget=1.25)`` keeps the *average* step time over
the first ``horizon`` steps (and, since the spaced schedules only get sparser, over any
longer run) within ``factor`` × the plain step time. It takes over every quantity's
schedule.

Quantities share work: the per-sample pass of the engine serves every first-order
statistic, one Hutchinson estimate or BackPACK extension serves all curvature
quantities, and a step with anything due pays a fixed bookkeeping cost. The budget
therefore schedules *tiers* of quantities, read from what each declares it needs
(``Needs``) at the first calibration step, and never from their names:

- tier 0, *bookkeeping*: no per-sample transform, no BackPACK extension, no Hessian-vector product;
- tier 1, *per-sample*: per-sample transforms only;
- tier 2, *curvature*: Hessian-vector products (``Needs.hvp``), an extension, or a diagonal the
  engine computes by its own backward passes (``Needs.diagonals``: the exact GGN's, one per class).

The schedules are nested (a step where a tier is due has every lower tier due too), so a
step where tiers ``0..k`` are due costs ``C_k``, the cost of all of them together,
measured as such.

1. *Calibration* (steps ``0 .. start − 1``; ``start`` = 21 at ``full``; counted from the
   first step entered, so a run resumed without the saved state calibrates where it
   resumes, while the planned schedules below are logarithmic in the global step; one
   resumed with ``Cockpit.load_state_dict`` keeps the saved plan): steps 0-2 track nothing
   (warm-up). At step 3 every quantity is due (its first recorded value; its
   ``Needs`` give its tier), at step 6 every quantity of the tiers below the top one,
   and so on, one set every third step; the bookkeeping tier, cheap enough to go every
   step, is due on a run of ``RUN`` consecutive steps. A closing run of ``RUN``
   untracked steps times the plain step ``T₀`` (the median of its inner periods, a
   period being the time from one ``cp(step)`` call to the next). The cost of a set due
   at step ``s`` is ``C = (P_{s−1} + P_s + P_{s+1}) / T₀ − 3`` plain steps: the watched
   forward pass, the backward pass and the computation, and what a quantity finishes at
   the next step (``Alpha``, ``UpdateSize``); the bookkeeping run's cost per step is the
   median of its periods over ``T₀``, minus one.
2. *Plan* (at step ``start − 1``, recorded in the log under ``"budget"``): with
   ``A = (factor − 1) · horizon`` plain steps to spend, of which calibration took
   ``Σ C``, every tier starts on the sparsest schedule, one step per four octaves
   (``L(1/4)`` below), and then, lowest tier first, each takes the densest schedule
   that the rest of ``A`` pays for and that is no denser than the tier below: every
   step, or ``L(m)`` for ``m`` = 32, 16, 8, 4, 2, 1, 1/2 steps per octave, where
   ``L(m) = {⌊2^{j/m}⌋ : j ≥ 0}`` (logarithmic: dense early in training, where things
   change fastest; ``L(1/4) ⊂ L(1/2) ⊂ … ⊂ L(32)``). A tier's marginal cost is
   ``C_k − C_{k−1}``; counting is exact over the steps ``[start, horizon)``. If even the
   floor does not fit, every tier keeps it and a warning gives the expected average.
3. From step ``start`` on the schedules are fixed: deterministic given the measured
   costs, and recorded, so ``Budget(plan=record[step]["budget"])`` replays a run's
   schedules (calibration steps included) without measuring anything.

Costs are measured once, on one step each: noisy on a busy machine (a negative cost
counts as zero), and the first step of a kind pays one-off warm-up costs, which errs
on the sparse side of the budget.
"""

import math
import statistics
import warnings

import torch

PER_OCTAVE = (32, 16, 8, 4, 2, 1, 0.5, 0.25)
"""The logarithmic schedules tried (steps per octave), densest first, after every step; the
last, one step per four octaves (``⌊16^j⌋``: 1, 16, 256, 4096, ...), is the floor."""

TIERS = ("bookkeeping", "per-sample", "curvature")
"""The tiers of work, cheapest first (see the module docstring)."""

FIRST = 3
"""The first calibration step: every quantity is due (steps 0-2 time the plain step)."""

SPACING = 3
"""Steps from one calibration set to the next (due step, its follow-up, a gap)."""

RUN = 6
"""Steps of the bookkeeping tier's calibration run, and of the untracked run that ends calibration."""


def tier_of(needs):
    """The tier (index into ``TIERS``) of a quantity that declared ``needs`` (``None``: nothing)."""
    if needs is None:
        return 0
    if needs.hvp or needs.extensions or needs.diagonals:
        return 2
    return 1 if needs.transforms else 0


def octave_steps(per_octave, start, stop):
    """The steps ``t`` of ``L(per_octave) = {⌊2^{j/m}⌋}`` with ``start ≤ t < stop`` (sorted)."""
    steps, j = set(), 0
    while True:
        t = int(math.floor(2 ** (j / per_octave)))
        if t >= stop:
            return sorted(steps)
        if t >= start:
            steps.add(t)
        j += 1


def _due(rule, step):
    """Whether a planned schedule ``rule`` (``{"every": 1}`` or ``{"per_octave": m, "from": t}``) is due."""
    if step < rule["from"]:
        return False
    if "every" in rule:
        return True
    m = rule["per_octave"]
    j = math.ceil(m * math.log2(step)) if step > 0 else 0
    return any(int(math.floor(2 ** (k / m))) == step for k in (j - 1, j, j + 1) if k >= 0)


class Budget:
    """The overhead budget of one run (see the module docstring)."""

    def __init__(self, factor=1.25, horizon=500, plan=None):
        """
        Args:
            factor: the allowed average step time, in plain step times (> 1).
            horizon: the number of steps over which the average is kept.
            plan: a recorded plan (``record[step]["budget"]``) to replay instead of
                measuring.

        Raises:
            ValueError: for a factor ≤ 1 or a horizon below 1.
        """
        if plan is not None:
            factor, horizon = plan["factor"], plan["horizon"]
        if not factor > 1:
            raise ValueError(f"the budget factor must exceed 1 (it is a multiple of the plain step time), got {factor!r}")
        if int(horizon) != horizon or horizon < 1:
            raise ValueError(f"horizon must be a positive number of steps, got {horizon!r}")
        self.factor, self.horizon = float(factor), int(horizon)
        self.plan = plan
        self.names = []
        self.tiers = dict(plan["tiers"]) if plan is not None else None  # name -> tier, known at origin + FIRST
        self.origin = plan.get("origin", 0) if plan is not None else None  # the first step entered
        self._starts = {}  # step -> time.perf_counter() at its cp(step) call
        self._due_at = {}  # name -> step -> bool, once the plan is fixed
        self.group = None

    def state_dict(self):
        """``{"factor", "horizon", "plan"}``: the plan once fixed (plain values), ``None`` during calibration."""
        return {"factor": self.factor, "horizon": self.horizon, "plan": self.plan}

    def load_state_dict(self, state):
        """Go on with a saved run's plan: its schedules, no new calibration.

        A state saved during calibration (no plan yet) leaves this budget to calibrate from
        the first step it sees (the saved run's timings were of another process).

        Raises:
            ValueError: for another factor or horizon than this budget's.
        """
        if (state["factor"], state["horizon"]) != (self.factor, self.horizon):
            raise ValueError(
                f"the saved run's overhead budget is {state['factor']}x over {state['horizon']} steps, this "
                f"Cockpit's {self.factor}x over {self.horizon}. Fix: create the resumed Cockpit with "
                f"budget=Budget({state['factor']}, horizon={state['horizon']})"
            )
        if state["plan"] is None:
            return
        self.plan = state["plan"]
        self.tiers = dict(self.plan["tiers"])
        self.origin = self.plan.get("origin", 0)
        self._fix()

    @property
    def levels(self):
        """The non-empty tiers, top first: calibration set ``i`` holds the tiers ``≤ levels[i]``."""
        return sorted(set(self.tiers.values()), reverse=True)

    def calibration(self):
        """``(sets, untracked)``: ``sets`` lists ``(top tier, due steps)``, top first; ``untracked``
        the closing run of untracked steps (known from step ``origin + FIRST`` on)."""
        sets, at = [], self.origin + FIRST
        for top in self.levels:
            steps = list(range(at, at + RUN)) if top == 0 else [at]
            sets.append((top, steps))
            at += RUN if top == 0 else SPACING
        return sets, list(range(at, at + RUN))

    @property
    def start(self):
        """The first step of the planned schedules (after calibration); ``None`` before step ``origin + FIRST``."""
        if self.tiers is None:
            return None
        return self.calibration()[1][-1] + 1

    def calibration_steps(self, name):
        """The calibration steps at which quantity ``name`` is due (all of them known from step
        ``origin + FIRST`` on; none before the first step)."""
        if self.tiers is None:
            return [] if self.origin is None else [self.origin + FIRST]
        return [t for top, steps in self.calibration()[0] if self.tiers[name] <= top for t in steps]

    def take_over(self, quantities, group=None):
        """Give every quantity the budget's schedule (called once by the Cockpit).

        ``group``: under torch.distributed, the Cockpit's ``Group``. The ranks plan from
        the mean of their measured periods, so that every rank fixes the same schedules
        (statistics of the global batch need every rank at the same collectives).
        """
        self.names = [q.name for q in quantities]
        self.group = group
        if self.plan is not None and sorted(self.plan["schedules"]) != sorted(self.names):
            raise ValueError(
                f"the budget plan schedules {sorted(self.plan['schedules'])} but the Cockpit "
                f"tracks {sorted(self.names)}: replay a plan with the quantities of its run"
            )
        for quantity in quantities:
            quantity._track_schedule = self._schedule(quantity.name)
        if self.plan is not None:
            self._fix()

    def _fix(self):
        """Make every quantity's schedule a cheap test (it runs at every step, due or not)."""
        for name in self.names:
            rule = self.plan["schedules"][name]
            start, calibration = rule["from"], frozenset(self.calibration_steps(name))
            if "every" in rule:
                def due(step, start=start, calibration=calibration):
                    return step >= start or step in calibration
            else:
                def due(step, steps=frozenset(octave_steps(rule["per_octave"], start, 2**40)) | calibration):
                    return step in steps
            self._due_at[name] = due

    def _schedule(self, name):
        def schedule(step):
            due = self._due_at.get(name)
            if due is None:  # not planned yet: calibration
                return step in self.calibration_steps(name)
            return due(step)

        schedule.__doc__ = f"Budget {self.factor}x schedule of {name} (see cockpit_lite.budget)."
        return schedule

    def saw(self, step, due):
        """Note what the due quantities need at ``step`` (``due``: ``[(quantity, Needs)]``).

        At step ``origin + FIRST``, where every quantity is due, this sorts them into tiers.
        """
        if self.plan is not None or self.origin is None or step != self.origin + FIRST:
            return
        tiers = {q.name: tier_of(n) for q, n in due}
        self.tiers = {name: tiers.get(name, 0) for name in self.names}

    def step_started(self, step, now):
        """Note the time of the ``cp(step)`` call; returns the plan when it is fixed at this step.

        Args:
            step: the global step.
            now: ``time.perf_counter()``.

        Returns:
            The plan (a dict, to be recorded under ``"budget"``) at step ``start − 1``
            when it was measured here, else ``None``.
        """
        if self.plan is not None or (self.start is not None and step >= self.start):
            return None
        if self.origin is None:
            self.origin = step
        if self.tiers is None and step > self.origin + FIRST:
            raise ValueError(
                f"the overhead budget calibrates on consecutive steps from the first one "
                f"({self.origin}), but step {self.origin + FIRST} was never entered (now {step}): "
                "call cp(step) with consecutive step numbers"
            )
        self._starts[step] = now
        if self.start is None or step != self.start - 1:
            return None
        periods = {t: self._starts[t + 1] - self._starts[t] for t in range(self.origin, step) if t + 1 in self._starts}
        missing = [t for t in range(self.origin, step) if t not in periods]
        if missing:
            raise ValueError(
                f"the overhead budget needs every calibration step {self.origin}..{step}, but the "
                f"steps {missing[:5]} were never entered: call cp(step) with consecutive step numbers"
            )
        if self.group is not None:
            steps = sorted(periods)
            mean = self.group.sum([torch.tensor([periods[t] for t in steps], dtype=torch.float64)])[0] / self.group.world
            periods = dict(zip(steps, mean.tolist()))
        self.plan = self.schedule_from(periods)
        self._fix()
        return self.plan

    def schedule_from(self, periods):
        """The plan for measured ``periods`` (``{step: seconds}`` of the calibration steps).

        Needs the tiers (``saw`` at step ``origin + FIRST``). Deterministic: the same periods give
        the same plan.
        """
        sets, untracked = self.calibration()
        plain = statistics.median(periods[t] for t in untracked[1:-1])
        levels = self.levels
        measured = [
            max(0.0, statistics.median(periods[t] for t in steps) / plain - 1) if len(steps) > 1
            else max(0.0, sum(periods[t] for t in (steps[0] - 1, steps[0], steps[0] + 1)) / plain - 3)
            for _, steps in sets
        ]
        # marginal cost of each non-empty tier: its set's cost minus the set below it
        marginal = {
            top: max(0.0, measured[i] - (measured[i + 1] if i + 1 < len(levels) else 0.0))
            for i, top in enumerate(levels)
        }
        spent = sum(cost * len(steps) for cost, (_, steps) in zip(measured, sets))
        stop = max(self.origin + self.horizon, self.start)  # the horizon counts from the first step
        options = ("every", *PER_OCTAVE)  # densest first; the last is the floor
        floor = options[-1]
        counts = {"every": stop - self.start, **{m: len(octave_steps(m, self.start, stop)) for m in PER_OCTAVE}}
        available = (self.factor - 1) * self.horizon - spent
        choice = {tier: len(options) - 1 for tier in marginal}  # index into options
        left = available - sum(marginal[t] * counts[floor] for t in marginal)
        feasible = left >= 0
        densest = 0  # a tier may be no denser than the one below it
        for tier in sorted(marginal):
            for index in range(densest, len(options) - 1):
                extra = marginal[tier] * (counts[options[index]] - counts[floor])
                if extra <= left:
                    choice[tier], left = index, left - extra
                    break
            densest = choice[tier]
        total = spent + sum(marginal[t] * counts[options[choice[t]]] for t in marginal)
        expected = 1 + total / max(self.horizon, 1)
        if not feasible:
            warnings.warn(
                f"the overhead budget {self.factor}x over {self.horizon} steps cannot be kept: "
                "calibration and one value per four octaves of steps for every quantity already "
                f"cost {expected:.2f}x the plain step on average. Track fewer quantities "
                "(e.g. configuration('business') or drop HessMaxEV), or allow a larger budget "
                "or horizon.",
                stacklevel=4,
            )

        def rule(tier):
            option = options[choice[tier]]
            return {"every": 1, "from": self.start} if option == "every" else {"per_octave": option, "from": self.start}

        return {
            "factor": self.factor,
            "horizon": self.horizon,
            "origin": self.origin,
            "plain_step_s": plain,
            "tiers": dict(self.tiers),
            "costs": {TIERS[t]: marginal[t] for t in sorted(marginal)},
            "calibration_cost": spent,
            "schedules": {n: rule(self.tiers[n]) for n in self.names},
            "expected_ratio": expected,
            "calibrated_at": {n: self.calibration_steps(n) for n in self.names},
        }


def as_budget(budget):
    """``None``, a factor (float) or a ``Budget`` → a ``Budget`` or ``None``."""
    if budget is None or isinstance(budget, Budget):
        return budget
    return Budget(budget)
