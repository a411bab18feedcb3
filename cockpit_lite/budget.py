"""An overhead budget: spacing out the expensive quantities so that a run stays cheap.

``Cockpit(model, configuration("full"), budget=1.25)`` keeps the average step time of the
run, counted from its first step to *any* later step (every prefix of the run, once the
first calibration has ended), within ``factor`` × the user's plain step time: the same
training step without a Cockpit. It takes over every quantity's schedule, and on the steps
where nothing is due it leaves the training step alone.

Quantities share work: the per-sample pass of the engine serves every first-order
statistic, one Hutchinson estimate or BackPACK extension serves all curvature quantities,
and a step with anything due pays a fixed bookkeeping cost. The budget therefore schedules
*tiers* of quantities, read from what each declares it needs (``Needs``), never from
their names:

- tier 0, *bookkeeping*: no per-sample transform, no BackPACK extension, no Hessian-vector product;
- tier 1, *per-sample*: per-sample transforms only;
- tier 2, *curvature*: Hessian-vector products (``Needs.hvp``), an extension, or a diagonal the
  engine computes by its own backward passes (``Needs.diagonals``: the exact GGN's, one per class).

Before a quantity has been due, its tier is the one it declares (``Quantity.TIER``), or read
from a ``SingleStepQuantity``'s ``TRANSFORMS``; any other quantity is planned as curvature
(the dearest) until its first due step shows its ``Needs``, which then decide (a re-plan).
The schedules are nested: a step whose *top* tier is ``k`` has every tier ``≤ k`` due.

*Bare steps.* At a bare step ``cp(step)`` returns at once, and the Cockpit's forward hooks
and optimizer step hooks are off (``Budget.unwatch``; the user's hooks stay): the step is
the user's plain step. The *period* of a step is the time from its ``cp(step)`` call to the
next one.

1. *Calibration*: ``WARMUP`` untracked steps from the first step entered, then a window of
   ``STEPS`` steps, ``PAIRS`` times two bare steps and two untracked ones (a change of the
   machine's load hits both alike). The median of the bare periods (less the ``cp(step)``
   calls, see below) is the plain step ``T₀``; the median over the pairs of an untracked period over the bare one before it,
   minus one, is ``u``: what a step with the Cockpit costs although nothing is due (its
   per-step calls, the diagnosis signals' hooks). The first plan is made at the window's
   last step.
2. *Idle steps are bare.* After the first calibration, a step is bare when nothing is due at
   it, at the step after it and at the two before it (those prepare, finish and time a due
   step), except the *probes*: steps ``t`` with ``t % PROBE`` 0 and 1 are bare, 2 and 3
   untracked, and nothing is due from ``PROBE − 1`` to 3. Each probe adds a pair of a bare
   and an untracked period; the last ``KEPT`` pairs give ``T₀`` and ``u`` at every re-plan.
   So ``u`` is paid on the steps around due ones and on two steps in every ``PROBE``, not on
   every step.
3. *Spend only what has been earned.* Every step earns ``factor − 1`` plain steps less the
   probes' ``2u / PROBE`` and the bare steps' calls, shared out among the present tiers by ``SHARES`` (a tier's account
   holds at most one step of its own; what it cannot hold goes to the tier above). Each tier
   has logarithmic *candidate* steps ``L(m) = {⌊2^{j/m}⌋ : j ≥ 0}`` (``m`` steps per octave,
   dense early in training, where things change fastest; or every step), the densest that
   its share pays for up to ``max(horizon, 2 × steps so far)``, no denser than the tier
   below. A candidate step makes its tier *pending*; at each step the highest pending tier
   whose account, and the run's balance as a whole, hold ``C_k`` runs (the tiers below with
   it) and pays ``C_k``: what such a step and its untracked neighbours cost over bare steps.
   So the modelled spending never runs ahead of what the steps so far have earned. Costs not
   yet measured are ``PRIOR`` plain steps.
4. *Measured, re-planned, recorded.* Every period but a bare one is charged as measured (its
   time over ``T₀``, minus one); the first calibration's first two periods (the Cockpit's
   first calls) as measured and its others as ``u`` (the bare ones nothing). Tracked steps
   closer than 4 apart, with the two periods before and the one after, measure their top
   tier's ``C_k`` (less the planned costs of the others among them; the median of the last
   ``KEEP`` measurements is the plan's cost). At the first step timed after a tier's first
   measurement or after a quantity's ``Needs`` changed its tier, and at the first step timed
   in every ``CHECK``, the budget re-plans: the accounts are set to what has been earned
   minus what has been charged. When the median of the last ``WINDOW`` bare periods has
   moved by more than ``DRIFT``× from ``T₀`` (a new sequence length, a slower data loader),
   it calibrates again (a window as above, nothing due meanwhile). A plan made at step ``p``
   governs the steps from ``p + 2`` on (the schedule of ``p + 1`` may have been asked
   already). Each plan is recorded in the log under ``"budget"`` at its step: the schedules
   are a deterministic function of the recorded plans, and ``Budget(plan=plans(record))``
   replays a run's schedules without timing anything.

Under torch.distributed the ranks plan from the mean of their measurements, at the same
steps (the steps of a re-plan depend only on the plans), so they fix the same schedules.

The ``cp(step)`` call of a bare step (the schedules' look-ups and the budget's accounts: tens of
microseconds) stays: it is timed (``Budget.took``), left out of the bare periods (``T₀`` and the
probes are the plain step's), and charged at every bare step, as ``bare_cost`` (plain steps) of
the plan, in what a step costs although nothing is due.

Limits: a bare step runs nothing of the Cockpit but that call, so at a bare step a non-finite loss is not located, a
replaced parameter is noticed at the next step that is not bare; a data-loader stall next to
a tracked step is charged to it (the budget errs on the sparse side); the first evaluation
of a tier is placed by its prior cost, so a tier dearer than its prior overshoots once, and
nothing runs until the steps after it have earned it back.
"""

import math
import statistics
import warnings

import torch

from cockpit_lite.optim import members

PER_OCTAVE = (32, 16, 8, 4, 2, 1, 0.5, 0.25)
"""The logarithmic schedules tried (steps per octave), densest first, after every step; the
last, one step per four octaves (``⌊16^j⌋``: 1, 16, 256, 4096, ...), is the floor."""

TIERS = ("bookkeeping", "per-sample", "curvature")
"""The tiers of work, cheapest first (see the module docstring)."""

SHARES = (0.4, 0.3, 0.3)
"""Each tier's share of what a step earns (renormalised over the tiers present)."""

PRIOR = (2.0, 60.0, 200.0)
"""The cost (plain steps) a tier is planned with before it has been measured."""

WARMUP = 10
"""Untracked steps before the calibration's runs (the first steps of a run are slow)."""

PAIRS = 8
"""Pairs of a bare and an untracked period in a calibration window (``STEPS``: 4 steps each)."""

STEPS = 4 * PAIRS
"""Steps of a calibration window: bare, bare, untracked, untracked, ... The first bare step's
period is bare (its next forward pass without the Cockpit's hooks), the first untracked
step's is untracked; the other two periods mix them and are not used."""

PROBE = 50
"""After the first calibration, steps ``t`` with ``t % PROBE`` 0 and 1 are bare and 2 and 3 untracked
(nothing due from ``t % PROBE == PROBE − 1`` to 3): one more pair of a bare and an untracked period
every ``PROBE`` steps; the last ``KEPT`` pairs give the plain step and ``u`` at each re-plan."""

KEPT = 16
"""Pairs of a bare and an untracked period kept (the calibration's and the probes')."""

KEEP = 3
"""Measurements of a tier's cost whose median is its planned cost."""

CHECK = 100
"""The budget re-plans at the first step it times in each ``CHECK`` steps (the ledger set to what
was measured, the plain step to the kept pairs')."""

WINDOW = 16
"""Untracked periods whose median is compared with the calibrated untracked step."""

DRIFT = 1.3
"""The change (either way) of the untracked step that calibrates again."""

HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")
"""A module's forward hooks and an optimizer's step hooks (``unwatch``; a module's keyword and
always-called flags stay keyed by the handle)."""

VERSION = 2
"""The plan format (older plans fixed one schedule per quantity and do not replay here)."""


def tier_of(needs):
    """The tier (index into ``TIERS``) of a quantity that declared ``needs`` (``None``: nothing)."""
    if needs is None:
        return 0
    if needs.hvp or needs.extensions or needs.diagonals:
        return 2
    return 1 if needs.transforms else 0


def expected_tier(quantity):
    """The tier ``quantity`` is planned in before its first due step (see the module docstring)."""
    from cockpit_lite.quantities.base import SingleStepQuantity

    if quantity.TIER is not None:
        return int(quantity.TIER)
    if isinstance(quantity, SingleStepQuantity) and type(quantity)._needs is SingleStepQuantity._needs:
        return 1 if quantity.TRANSFORMS else 0
    return len(TIERS) - 1


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


def _candidate(option, step):
    """Whether ``step`` is a candidate step of ``option`` (``"every"`` or ``m`` steps per octave)."""
    if option == "every":
        return True
    j = math.ceil(option * math.log2(step)) if step > 0 else 0
    return any(int(math.floor(2 ** (k / option))) == step for k in (j - 1, j, j + 1) if k >= 0)


def plans(record):
    """The budget's plans in a record (``Cockpit.get_output()`` or ``log.read``), in step order:
    what ``Budget(plan=...)`` replays."""
    return [record[step]["budget"] for step in sorted(record) if "budget" in record[step]]


class Budget:
    """The overhead budget of one run (see the module docstring)."""

    def __init__(self, factor=1.25, horizon=500, plan=None):
        """
        Args:
            factor: the allowed average step time, in plain step times (> 1).
            horizon: the run length the candidate schedules are first planned for (they are
                planned again for twice the steps so far as the run goes on); the average
                holds at every length either way.
            plan: the recorded plans of a run to replay instead of measuring
                (``plans(record)``), or one of them (``record[step]["budget"]``: replayed
                from its step on, the later re-plans of that run left out).

        Raises:
            ValueError: for a factor ≤ 1, a horizon below 1, or a plan of another format.
        """
        replay = [] if plan is None else [plan] if isinstance(plan, dict) else list(plan)
        for recorded in replay:
            if not isinstance(recorded, dict) or recorded.get("version") != VERSION:
                raise ValueError(
                    "Budget(plan=...) replays the plans of this version of cockpit-lite's budget "
                    f"(format {VERSION}), got {recorded!r:.80}. Fix: pass plans(record) of a run "
                    "recorded with this version, or measure anew (budget=factor)"
                )
        if replay:
            factor, horizon = replay[0]["factor"], replay[0]["horizon"]
        if not factor > 1:
            raise ValueError(f"the budget factor must exceed 1 (it is a multiple of the plain step time), got {factor!r}")
        if int(horizon) != horizon or horizon < 1:
            raise ValueError(f"horizon must be a positive number of steps, got {horizon!r}")
        self.factor, self.horizon = float(factor), int(horizon)
        self._replay = {p["step"]: p for p in replay}
        self.plan = None  # the plan in force
        self.names, self.tiers, self.group = [], {}, None
        self.origin = replay[0]["origin"] if replay else None
        self._calibration = None  # the calibration window in progress: its first (bare) step
        self._windows = []  # every calibration window's first step
        self._bare = set()  # their bare steps
        self._windowed = set()  # all their steps
        if replay:
            self._window(self.origin + WARMUP)
        self._unwatched = None  # the Cockpit's hooks taken off the model for the bare steps
        self._starts = {}  # step -> time.perf_counter() at its cp(step) call (recent steps only)
        self._own = {}  # bare step -> seconds its cp(step) call took (recent steps only): the Cockpit's, not the plain step's
        self._owns = []  # those of the last WINDOW bare periods accounted (seconds)
        self._tops = {}  # step -> the top tier due at it, from the plan in force (absent up to the simulation's step: nothing)
        self._state = None  # the simulation's (step, accounts, pending) after its last step
        self._spent = 0.0  # plain steps really spent since the plan in force was made
        self._measured = {}  # tier -> its last KEEP measured costs
        self._idle = []  # the last WINDOW bare periods of idle steps (seconds)
        self._pairs = []  # the last KEPT (bare, untracked) periods (seconds)
        self._early = []  # the periods of the first calibration (seconds), less the Cockpit's own time at bare steps
        self._early_own = 0.0  # that own time (seconds)
        self._probe = None  # the bare period of the probe in progress
        self._block = None  # the tracked steps being measured: [their periods' excess, their top tiers]
        self._excess = []  # the excess of the last two periods (plain steps)
        self._replan = False  # a tier measured first, or changed (``saw``): re-plan at the next timed step

    # --- the Cockpit's interface -------------------------------------------------------------

    def take_over(self, quantities, group=None):
        """Give every quantity the budget's schedule (called once by the Cockpit).

        ``group``: under torch.distributed, the Cockpit's ``Group``: the ranks plan from the
        mean of their measurements, so that every rank fixes the same schedules.
        """
        self.names = [q.name for q in quantities]
        self.group = group
        self.tiers = {q.name: expected_tier(q) for q in quantities}
        if self._replay:
            first = next(iter(self._replay.values()))
            if sorted(first["tiers"]) != sorted(self.names):
                raise ValueError(
                    f"the budget plan schedules {sorted(first['tiers'])} but the Cockpit tracks "
                    f"{sorted(self.names)}: replay a plan with the quantities of its run"
                )
        for quantity in quantities:
            quantity._track_schedule = self._schedule(quantity.name)

    def state_dict(self):
        """``{"factor", "horizon", "plan"}``: the plan in force (plain values), ``None`` during
        the first calibration."""
        return {"factor": self.factor, "horizon": self.horizon, "plan": self.plan}

    def load_state_dict(self, state):
        """Go on with a saved run's plan: its schedules, no new calibration.

        A state saved during the first calibration (no plan yet) leaves this budget to calibrate
        from the first step it sees (the saved run's timings were of another process).

        Raises:
            ValueError: for another factor or horizon than this budget's.
        """
        if (state["factor"], state["horizon"]) != (self.factor, self.horizon):
            raise ValueError(
                f"the saved run's overhead budget is {state['factor']}x over {state['horizon']} steps, this "
                f"Cockpit's {self.factor}x over {self.horizon}. Fix: create the resumed Cockpit with "
                f"budget=Budget({state['factor']}, horizon={state['horizon']})"
            )
        if state["plan"] is not None:
            self.origin = state["plan"]["origin"]
            self._window(self.origin + WARMUP)  # (the probes' steps count from its end)
            self._apply(state["plan"])

    def bare(self, step):
        """Whether ``step`` is bare (``cp(step)`` does nothing, the Cockpit's hooks are off): a
        calibration's or a probe's bare step, or, after the first calibration, an idle step (nothing
        due at it, at the step after it and at the two before it: those finish and time a due step)
        outside the calibrations' and probes' untracked steps."""
        if step in self._bare:
            return True
        if not self._probing(step) or step in self._windowed:
            return False
        if step % PROBE < 4:
            return step % PROBE < 2
        return all(self.top(t) is None for t in (step - 2, step - 1, step, step + 1))

    def _window(self, first):
        """A calibration window from step ``first`` on."""
        self._windows.append(first)
        self._windowed.update(range(first, first + STEPS))
        self._bare.update(first + i for i in range(STEPS) if i % 4 < 2)

    def _probing(self, step):
        """Whether ``step`` lies after the first calibration (its plan's step), where the probes are
        (``PROBE``) and idle steps are bare."""
        return bool(self._windows) and step >= self._windows[0] + STEPS

    def unwatch(self, model, optimizer, on):
        """Take the Cockpit's forward hooks off ``model``'s modules and its step hooks off ``optimizer``
        (``on``) for the bare steps, or put them back where they were (a hook is the Cockpit's
        when its function is cockpit-lite's; the user's hooks stay, in their order)."""
        if on and self._unwatched is None:
            self._unwatched = []
            owners = [*(model.modules() if model is not None else ()), *members(optimizer)]
            for hooks in (getattr(owner, name, None) for owner in owners for name in HOOK_DICTS):
                ours = {key: hook for key, hook in (hooks or {}).items()
                        if getattr(hook, "__module__", "").startswith("cockpit_lite")}
                if ours:
                    self._unwatched.append((hooks, ours, list(hooks)))
                for key in ours:
                    del hooks[key]
        elif not on and self._unwatched is not None:
            for hooks, ours, order in self._unwatched:
                merged = {**hooks, **ours}
                keys = [key for key in order if key in merged] + [key for key in merged if key not in order]
                hooks.clear()
                hooks.update((key, merged[key]) for key in keys)
            self._unwatched = None

    def saw(self, step, due):
        """Note what the due quantities need at ``step`` (``due``: ``[(quantity, Needs)]``): a
        quantity whose ``Needs`` put it in another tier than planned makes the budget re-plan."""
        for quantity, needs in due:
            tier = tier_of(needs)
            if self.tiers.get(quantity.name) != tier:
                self.tiers[quantity.name] = tier
                self._replan = True

    def took(self, step, seconds):
        """Note that the ``cp(step)`` call of a bare ``step`` took ``seconds`` (the Cockpit's own time in the
        step's period: not part of the plain step, charged as overhead). A replay measures nothing."""
        if not self._replay:
            self._own[step] = seconds

    def step_started(self, step, now):
        """Note the time of the ``cp(step)`` call; returns a plan when one is made at this step.

        Args:
            step: the global step.
            now: ``time.perf_counter()``.

        Returns:
            The plan (a dict, to be recorded under ``"budget"``) made at ``step``, else ``None``.
        """
        if self.origin is None:
            self.origin = step
            self._calibration = step + WARMUP
            self._window(self._calibration)
        if step in self._replay:
            return self._apply(self._replay[step])
        if self._replay and self.plan is None and step < min(self._replay):
            return None  # a replay's first calibration: nothing due, nothing measured
        if self._replay:
            return None
        if self.plan is None and step > self.origin and step - 1 not in self._starts:
            raise ValueError(
                f"the overhead budget calibrates on consecutive steps from the first one "
                f"({self.origin}), but step {step - 1} was never entered (now {step}): call cp(step) "
                "with consecutive step numbers"
            )
        self._starts[step] = now
        self._starts.pop(step - STEPS - 2, None)
        self._own.pop(step - STEPS - 2, None)
        if step - 1 in self._starts:
            self._period(step - 1, now - self._starts[step - 1])
        if self.bare(step):
            return None  # (nothing more: the period of a bare step is the plain step's)
        calibrating = self._calibration is not None
        if calibrating and step == self._calibration + STEPS - 1:
            return self._calibrated(step)
        if calibrating or self.plan is None:
            return None
        if self._probing(step) and step % PROBE == 2:
            return None  # (a probe's untracked period starts: nothing more in it than in any step)
        check = step // CHECK > self.plan["step"] // CHECK
        if self._replan or check:
            return self._make_plan(step, drifted=check and self._drifted())
        return None

    # --- measuring ----------------------------------------------------------------------------

    def _period(self, t, seconds):
        """Account the period of step ``t`` (from ``cp(t)`` to ``cp(t + 1)``)."""
        own = self._own.get(t, 0.0)  # (a bare step's cp(t) call: the rest of its period is the plain step)
        if own:
            self._owns = (self._owns + [own])[-WINDOW:]
        if self.plan is None:  # the first calibration: charged at its end, once the plain step is known
            self._early.append(seconds - own)
            self._early_own += own
            return
        excess = seconds / self.plan["plain_step_s"] - 1
        if self._calibration is not None:  # (a calibration again: charged as measured)
            self._spent += excess
            return
        if self.bare(t):  # (quick: this runs in the next step, maybe a bare one)
            self._excess = (self._excess + [excess])[-2:]
            if self._block is not None:
                self._block[0] += excess
            if not self.bare(t + 1):  # (its next forward pass had the hooks back: a part of what is due)
                self._spent += excess
            elif t % PROBE:  # a bare period: the plain step's and the Cockpit's call (charged)
                self._idle.append(seconds - own)
                del self._idle[:-WINDOW]
                self._spent += own / self.plan["plain_step_s"]
            else:
                self._probe = seconds - own
                self._spent += own / self.plan["plain_step_s"]
            return
        self._spent += excess
        if self._probing(t) and t % PROBE == 2 and self._probe is not None:
            self._pairs = (self._pairs + [(self._probe, seconds)])[-KEPT:]
            self._probe = None
        top = self.top(t)
        if self._block is None and top is not None:  # tracked steps closer than 4 apart, the 2 periods before
            self._block = [sum(self._excess), []]
        if self._block is not None:
            self._block[0] += excess
            if top is not None:
                self._block[1].append(top)
            elif all(self.top(s) is None for s in (t + 1, t + 2, t + 3)):  # (and the one after: it closes)
                total, tops = self._block
                self._block = None
                k = max(tops)  # its top tier's cost: the rest less what the plan says the others cost
                others = sum(self.plan["costs"][TIERS[j]] for j in tops if j != k)
                cost = max(0.0, (total - others) / tops.count(k))
                self._measured[k] = (self._measured.get(k, []) + [cost])[-KEEP:]
                if not self.plan["measured"][TIERS[k]]:
                    self._replan = True
        self._excess = (self._excess + [excess])[-2:]

    def _mean(self, values):
        """``values`` (floats) averaged over the ranks (as they are, in one process)."""
        if self.group is None:
            return values
        total = self.group.sum([torch.tensor(values, dtype=torch.float64)])[0]
        return (total / self.group.world).tolist()

    def _calibrated(self, step):
        """The plan at the end of a calibration window (``step``: its last untracked step)."""
        a = self._calibration
        missing = [t for t in range(a, step + 1) if t not in self._starts]
        if missing and self.plan is not None:  # steps skipped while calibrating again: the old times stay
            self._calibration = None
            return self._make_plan(step)
        if missing:
            raise ValueError(
                f"the overhead budget needs every calibration step {a}..{step}, but the steps "
                f"{missing[:5]} were never entered: call cp(step) with consecutive step numbers"
            )
        periods = [self._starts[t + 1] - self._starts[t] - self._own.get(t, 0.0) for t in range(a, step)]
        self._pairs = list(zip(periods[0::4], periods[2::4]))
        self._calibration = None
        return self._make_plan(step, *self._times())

    def _times(self):
        """``(plain, untracked, own)`` step times (s) from the kept pairs and the bare steps' ``cp(step)``
        calls (the ranks' mean), or ``(None, None, None)`` with fewer than ``PAIRS`` pairs on any rank."""
        bare = [b for b, _ in self._pairs]
        enough = len(self._pairs) >= PAIRS
        plain = statistics.median(bare) if enough else 0.0
        ratio = max(1.0, statistics.median(u / b for b, u in self._pairs)) if enough else 0.0
        own = statistics.median(self._owns) if self._owns else 0.0
        enough, plain, ratio, own = self._mean([float(enough), plain, ratio, own])
        return (plain, plain * ratio, own) if enough == 1 else (None, None, None)

    def _drifted(self):
        """Whether the plain step moved by more than ``DRIFT``× since calibration (ranks' mean)."""
        median = statistics.median(self._idle) if len(self._idle) == WINDOW else 0.0
        full, median = self._mean([float(len(self._idle) == WINDOW), median])
        if full < 1:
            return False
        ratio = median / self.plan["plain_step_s"]
        return not 1 / DRIFT <= ratio <= DRIFT

    def _idle_cost(self, plan=None):
        """What a step costs on average although nothing is due: the probes' two untracked steps in
        every ``PROBE`` (idle steps are bare), in plain steps."""
        plan = plan or self.plan
        return 2 * plan["untracked_cost"] / PROBE + plan.get("bare_cost", 0.0)  # (absent from older plans: 0)

    # --- planning -----------------------------------------------------------------------------

    def _make_plan(self, step, plain=None, untracked=None, own=None, drifted=False):
        """A new plan made at ``step`` (governing the steps from ``step + 2`` on: the schedules of
        the next step may have been asked already), applied and returned."""
        old = self.plan
        if plain is None:
            plain, untracked, own = self._times()
        if plain is None:
            plain, untracked, own = old["plain_step_s"], old["untracked_s"], old.get("bare_s", 0.0)
        u = max(0.0, untracked / plain - 1)
        bare = own / plain  # a bare step's cp(step) call, in plain steps
        present = sorted(set(self.tiers.values()))
        earned = (self.factor - 1) * (step - self.origin)  # (the periods up to step - 1 are measured)
        idle = 2 * u / PROBE + bare
        if old is None:  # the first calibration: its first two periods as measured (the Cockpit's first
            # steps), the others as what they are (a bare period its cp(step) call, another u; not the load's spikes)
            *early, early_own = self._mean(self._early + [self._early_own])
            a = self._windows[0] - self.origin
            spent_before = sum(p / plain - 1 for p in early[:2]) + u * sum(
                1 for i in range(2, len(early)) if not (i >= a and (i - a) % 4 == 0)) + early_own / plain
            fired = {}
            accounts, ahead = None, 2 * (self.factor - 1 - idle)
        else:
            self.top(step + 1)  # the simulation up to the steps this plan leaves to the one before
            _, accounts, _ = self._state
            spent_before = old["spent"] + self._mean([self._spent])[0]
            fired = dict(old["fired"])
            for t in range(old["step"] + 2, step + 2):
                if self._tops.get(t) is not None:
                    fired[TIERS[self._tops[t]]] = fired.get(TIERS[self._tops[t]], 0) + 1
            ahead = sum(self.factor - 1 - self._idle_cost(old) - (
                old["costs"][TIERS[self._tops[t]]] if self._tops.get(t) is not None else 0.0) for t in (step, step + 1))
        measured = {TIERS[k]: statistics.median(v) for k, v in self._measured.items() if v}
        measured = dict(zip(measured, self._mean(list(measured.values()))))
        costs, known = {}, {}
        for k in range(len(TIERS)):
            name = TIERS[k]
            if name in measured:
                costs[name], known[name] = measured[name], True
            elif old is not None and old["measured"][name]:
                costs[name], known[name] = old["costs"][name], True
            else:
                costs[name], known[name] = PRIOR[k], False
        for k in range(1, len(TIERS)):  # a step of a higher tier runs the lower ones too
            costs[TIERS[k]] = max(costs[TIERS[k]], costs[TIERS[k - 1]])
        balance = earned - spent_before + ahead  # (after step + 1, as the simulation's accounts)
        shares = {TIERS[k]: SHARES[k] / sum(SHARES[j] for j in present) for k in present}
        if accounts is None or sum(accounts.values()) == 0 or balance < 0:  # (in debt: no tier spends)
            accounts = {t: balance * s for t, s in shares.items()}
        else:  # what the model spent differs from what was measured: the difference shared as held
            held = {t: max(accounts.get(t, 0.0), 0.0) for t in shares}
            weights = held if sum(held.values()) > 0 else shares
            correction = balance - sum(accounts.get(t, 0.0) for t in shares)
            accounts = {t: accounts.get(t, 0.0) + correction * weights[t] / sum(weights.values()) for t in shares}
        per_step = self.factor - 1 - idle
        stop = self.origin + max(self.horizon, 2 * (step + 1 - self.origin))
        options, densest = {}, 0
        choices = ("every", *PER_OCTAVE)
        for k in present:
            name = TIERS[k]
            room = accounts[name] + shares[name] * per_step * max(stop - step - 1, 0)
            index = len(choices) - 1
            for i in range(densest, len(choices) - 1):
                count = stop - step - 1 if choices[i] == "every" else len(octave_steps(choices[i], step + 1, stop))
                if count * costs[name] <= room:
                    index = i
                    break
            options[name], densest = choices[index], index
        recalibrate = step + 3 if drifted else None  # (step + 1 is the plan before's: maybe due)
        plan = {
            "version": VERSION,
            "factor": self.factor,
            "horizon": self.horizon,
            "origin": self.origin,
            "step": step,
            "plain_step_s": plain,
            "untracked_s": untracked,
            "untracked_cost": u,
            "bare_s": own,
            "bare_cost": bare,
            "tiers": dict(self.tiers),
            "costs": costs,
            "measured": known,
            "shares": shares,
            "accounts": accounts,
            "pending": {TIERS[k]: bool(old is not None and self._state[2].get(TIERS[k], False)) for k in present},
            "candidates": options,
            "recalibrate": recalibrate,
            "spent": spent_before,
            "average": 1 + spent_before / max(step - self.origin, 1),
            "fired": fired,
            "bought": {TIERS[k]: sorted(n for n, t in self.tiers.items() if t == k) for k in present},
        }
        if per_step <= 0 and (old is None or self.factor - 1 - self._idle_cost(old) > 0):
            warnings.warn(
                f"the overhead budget {self.factor}x cannot be kept: the Cockpit's untracked steps cost "
                f"{1 + u:.2f}x the plain step (its per-step calls and the diagnosis signals' hooks) and its call "
                f"at an idle step {bare:.2f} of a plain step, and even those and the two of every {PROBE} that "
                "time them cost more than the budget, so nothing is tracked. Allow a larger budget",
                stacklevel=4,
            )
        return self._apply(plan)

    def _apply(self, plan):
        """Put ``plan`` in force (made at ``plan["step"]``, governing the steps from the one after the
        next on); returns it."""
        step = plan["step"]
        self.top(step + 1)  # the steps up to the next keep the schedules of the plan before (asked ahead)
        self.plan = plan
        self.tiers = dict(plan["tiers"])
        self._tops = {t: top for t, top in self._tops.items() if t <= step + 1}
        self._state = (step + 1, dict(plan["accounts"]), dict(plan["pending"]))
        stop = step + 1 + 4 * CHECK  # the candidates as sets (a plan rarely governs longer; beyond, computed)
        self._sets = {name: (stop, None if option == "every" else frozenset(octave_steps(option, step + 1, stop)))
                      for name, option in plan["candidates"].items()}
        if plan["recalibrate"] is not None:
            self._calibration = plan["recalibrate"]
            self._window(self._calibration)
        self._spent = 0.0
        self._replan = False
        self._measured = {k: v for k, v in self._measured.items() if not plan["measured"][TIERS[k]] or v}
        return plan

    # --- the schedules ------------------------------------------------------------------------

    def top(self, step):
        """The top tier due at ``step`` (``None``: nothing), a deterministic function of the plans."""
        top = self._tops.get(step)
        if top is not None or self.plan is None or step <= self._state[0]:
            return top
        plan = self.plan
        t, accounts, pending = self._state
        present = sorted(TIERS.index(name) for name in plan["shares"])
        per_step = self.factor - 1 - self._idle_cost(plan)
        window = plan["recalibrate"]
        while t < step:
            t += 1
            carry = 0.0
            for k in present:  # earn; what an account cannot hold goes to the tier above
                name = TIERS[k]
                accounts[name] += per_step * plan["shares"][name] + carry
                cap = plan["costs"][name]
                carry = max(0.0, accounts[name] - cap) if k != present[-1] else 0.0
                accounts[name] -= carry
                if not pending[name]:
                    stop, steps = self._sets[name]
                    pending[name] = steps is None or (t in steps if t < stop else _candidate(plan["candidates"][name], t))
            top = None
            probe = self._probing(t + 1) and (t + 1) % PROBE < 5
            if not probe and (window is None or not window - 1 <= t < window + STEPS):
                total = sum(accounts.values())  # (no tier spends while the run as a whole is in debt)
                affordable = [k for k in present if pending[TIERS[k]]
                              and min(accounts[TIERS[k]], total) >= plan["costs"][TIERS[k]]]
                if affordable:
                    top = affordable[-1]
                    accounts[TIERS[top]] -= plan["costs"][TIERS[top]]
                    for k in present:
                        if k <= top:
                            pending[TIERS[k]] = False
            if top is not None:  # (the steps with a tier due only: a long run keeps few)
                self._tops[t] = top
        self._state = (t, accounts, pending)
        return self._tops.get(step)

    def _schedule(self, name):
        def schedule(step):
            top = self.top(step)
            return top is not None and self.tiers[name] <= top

        schedule.__doc__ = f"Budget {self.factor}x schedule of {name} (see cockpit_lite.budget)."
        return schedule


def as_budget(budget):
    """``None``, a factor (float) or a ``Budget`` → a ``Budget`` or ``None``."""
    if budget is None or isinstance(budget, Budget):
        return budget
    return Budget(budget)
