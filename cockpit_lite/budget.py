"""An overhead budget: spacing out the expensive quantities so that a run stays cheap.

``Cockpit(model, configuration("full"), budget=1.25)`` keeps the *average* step time over
the first ``horizon`` steps (and, since the spaced schedules only get sparser, over any
longer run) within ``factor`` × the plain step time. It takes over every quantity's
schedule:

1. *Calibration* (the first ``3 + 2Q`` steps for ``Q`` quantities, in the order given):
   steps 0-2 track nothing and time the plain step ``T₀`` (the shorter of the periods
   of steps 0 and 1, a period being the time from one ``cp(step)`` call to the next);
   then each quantity is due alone at step ``3 + 2i`` (its first recorded value),
   followed by an untracked step, and its cost is the extra time of the two periods
   around it: ``c_i = (P_{2+2i} + P_{3+2i}) / T₀ − 2`` plain steps (the first holds the
   watched forward pass, the second the backward pass and the computation).
2. *Plan* (at step ``2 + 2Q``, recorded in the log under ``"budget"``): with
   ``A = (factor − 1) · horizon − (calibration overhead)`` plain steps to spend, every
   quantity starts on the sparsest schedule, one step per octave (``L(1)`` below), and
   then, cheapest first, each takes the densest schedule that the rest of ``A`` pays
   for: every step, or ``L(m)`` for ``m`` = 32, 16, 8, 4, 2 steps per octave, where
   ``L(m) = {⌊2^{j/m}⌋ : j ≥ 0}`` (logarithmic: dense early in training, where things
   change fastest). Counting is exact over the steps ``[3 + 2Q, horizon)``.
   If even one step per octave does not fit, every quantity keeps it and a warning
   gives the expected average.
3. From step ``3 + 2Q`` on the schedules are fixed: deterministic given the measured
   costs, and recorded, so ``Budget(plan=record[step]["budget"])`` replays a run's
   schedules without measuring anything.

Costs are measured once, on one step each: noisy on a busy machine (a negative cost
counts as zero). Quantities that share work (per-sample transforms, a BackPACK
extension) are charged as if alone, which errs on the cheap side of the budget.
"""

import math
import warnings

PER_OCTAVE = (32, 16, 8, 4, 2)
"""Denser logarithmic schedules tried (steps per octave), after every step."""


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
        self._starts = {}  # step -> time.perf_counter() at its cp(step) call

    @property
    def start(self):
        """The first step of the planned schedules (after calibration)."""
        return 3 + 2 * len(self.names)

    def calibration_step(self, name):
        """The step at which quantity ``name`` is due alone."""
        return 3 + 2 * self.names.index(name)

    def take_over(self, quantities):
        """Give every quantity the budget's schedule (called once by the Cockpit)."""
        self.names = [q.name for q in quantities]
        if self.plan is not None and sorted(self.plan["schedules"]) != sorted(self.names):
            raise ValueError(
                f"the budget plan schedules {sorted(self.plan['schedules'])} but the Cockpit "
                f"tracks {sorted(self.names)}: replay a plan with the quantities of its run"
            )
        for quantity in quantities:
            quantity._track_schedule = self._schedule(quantity.name)

    def _schedule(self, name):
        def schedule(step):
            if step == self.calibration_step(name):
                return True
            if step < self.start or self.plan is None:
                return False
            return _due(self.plan["schedules"][name], step)

        schedule.__doc__ = f"Budget {self.factor}x schedule of {name} (see cockpit_lite.budget)."
        return schedule

    def step_started(self, step, now):
        """Note the time of the ``cp(step)`` call; returns the plan when it is fixed at this step.

        Args:
            step: the global step.
            now: ``time.perf_counter()``.

        Returns:
            The plan (a dict, to be recorded under ``"budget"``) at step ``start − 1``
            when it was measured here, else ``None``.
        """
        if self.plan is not None or step >= self.start:
            return None
        self._starts[step] = now
        if step != self.start - 1:
            return None
        periods = {t: self._starts[t + 1] - self._starts[t] for t in range(step) if t + 1 in self._starts}
        missing = [t for t in range(step) if t not in periods]
        if missing:
            raise ValueError(
                f"the overhead budget needs every calibration step 0..{step}, but the steps "
                f"{missing[:5]} were never entered: call cp(step) with consecutive step numbers from 0"
            )
        self.plan = self.schedule_from(periods)
        return self.plan

    def schedule_from(self, periods):
        """The plan for measured ``periods`` (``{step: seconds}`` of the calibration steps).

        Deterministic: the same periods give the same plan.
        """
        plain = min(periods[0], periods[1])
        costs = {
            name: max(0.0, (periods[self.calibration_step(name) - 1] + periods[self.calibration_step(name)]) / plain - 2)
            for name in self.names
        }
        spent = sum(costs.values())
        stop = max(self.horizon, self.start)
        counts = {"every": stop - self.start, **{m: len(octave_steps(m, self.start, stop)) for m in (1, *PER_OCTAVE)}}
        available = (self.factor - 1) * self.horizon - spent
        choice = {name: 1 for name in self.names}
        left = available - sum(costs[n] * counts[1] for n in self.names)
        feasible = left >= 0
        for name in sorted(self.names, key=lambda n: (costs[n], self.names.index(n))):
            for option in ("every", *PER_OCTAVE):
                extra = costs[name] * (counts[option] - counts[1])
                if extra <= left:
                    choice[name], left = option, left - extra
                    break
        total = spent + sum(costs[n] * counts[choice[n]] for n in self.names)
        expected = 1 + total / max(self.horizon, 1)
        if not feasible:
            warnings.warn(
                f"the overhead budget {self.factor}x over {self.horizon} steps cannot be kept: "
                "calibration and one value per octave of steps for every quantity already "
                f"cost {expected:.2f}x the plain step on average. Track fewer quantities "
                "(e.g. configuration('business') or drop HessMaxEV), or allow a larger budget "
                "or horizon.",
                stacklevel=4,
            )
        schedules = {
            n: {"every": 1, "from": self.start} if choice[n] == "every" else {"per_octave": choice[n], "from": self.start}
            for n in self.names
        }
        return {
            "factor": self.factor,
            "horizon": self.horizon,
            "plain_step_s": plain,
            "costs": costs,
            "schedules": schedules,
            "expected_ratio": expected,
            "calibrated_at": {n: self.calibration_step(n) for n in self.names},
        }


def as_budget(budget):
    """``None``, a factor (float) or a ``Budget`` → a ``Budget`` or ``None``."""
    if budget is None or isinstance(budget, Budget):
        return budget
    return Budget(budget)
