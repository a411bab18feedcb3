"""The orchestrator: one ``Cockpit`` per training run, one context per tracked step.

Per step, ``with cp(step, *extra_extensions, info={...}): loss.backward(...)``:

1. *Before backward* (``cp(...)``, after the forward pass): every quantity states its
   ``Needs`` for this step (or ``None``); missing ``info`` keys raise here. The needs
   are merged: transforms by key, BackPACK extensions by type (the user's own
   extensions win and stay on the parameters afterwards). Quantities that need
   Hessian-vector products (``Needs.hvp``) do them as the context is entered, from one gradient with graph the
   Cockpit takes of the loss and drops afterwards (``cockpit_lite.curvature.hvp``), so
   the user's backward stays plain and training bit-identical. The per-sample engine
   (``cockpit_lite.engine``) plans the step from the forward pass it watched.
2. *During backward*: the engine reduces individual gradients layer by layer and drops
   them; BackPACK runs the curvature extensions, if any are due.
3. *After backward* (``__exit__``): each due quantity computes from a ``StepData``
   bundle; all values move to the host in one transfer; the record and the JSON-lines
   log get the step; BackPACK buffers the Cockpit added are deleted. The engine is armed
   to watch the next forward pass only if something is due at the next step.

Steps where nothing is due run without any hook: no forward hooks, no extensions.
"""

import copy
import numbers
import warnings

import numpy as np
import torch

from cockpit_lite import budget as _budget
from cockpit_lite import diagnosis as _diagnosis
from cockpit_lite.diagnosis import precedence as _precedence
from cockpit_lite import distributed as _distributed
from cockpit_lite import log as _log
from cockpit_lite import state as _state
from cockpit_lite import subsample as _subsample
from cockpit_lite.engine import Engine
from cockpit_lite.quantities import REGISTRY
from cockpit_lite.quantities.base import Quantity
from cockpit_lite.step_context import StepContext

STATE_FORMAT = "cockpit-lite state"
STATE_VERSION = 1
"""The ``"format"`` and ``"version"`` of ``Cockpit.state_dict()``."""


class Cockpit:
    """Collect quantities during training (API compatible with Cockpit's ``Cockpit``)."""

    def __init__(self, params, quantities=None, log=None, strict=False, seed=0, sinks=(), diagnose=True, budget=None,
                 accumulate=False, samples=None):
        """
        Args:
            params: what to track: a ``torch.nn.Module`` (its named parameters; the
                recommended form: individual gradients then come from fast layer rules),
                an iterable of parameters (e.g. ``model.parameters()``) or of
                ``(name, parameter)`` pairs (``model.named_parameters()``; Cockpit's
                recipe): then the engine finds the modules that own them in the first
                tracked forward pass and serves them by the same fast layer rules (and,
                on a BackPACK-extended model, the same exact curvature) as with the
                module; parameters no module owns take the exact but slower global path
                of ``cockpit_lite.engine``. Names label the per-layer values. Parameters
                with ``requires_grad=False`` are left out with a warning.
            quantities: list of ``Quantity`` objects, e.g. ``configuration("full")``.
            log: path of a JSON-lines log, appended and flushed after every step
                (``None``: keep the record in memory only).
            strict: raise instead of recording NaN when the loss or a gradient is
                not finite, or when a quantity fails.
            seed: seed of the Cockpit's own random numbers (BackPACK's Monte-Carlo
                curvature); the user's random number generators are never touched.
            sinks: objects with ``write(step, entries, names)`` and ``close()`` that
                get every recorded part of a step (host values, as in the record;
                ``names`` are the parameter names), e.g.
                ``cockpit_lite.integrations.tensorboard.TensorBoardSink``. A failing
                sink warns (raises with ``strict=True``).
            diagnose: run the diagnosis rules after every step (``cockpit_lite.diagnosis``):
                the signals they need (``diagnosis.SIGNALS``) are tracked in addition to
                ``quantities`` (or alone, when ``quantities`` is ``None``); each new finding
                is logged once (logger ``"cockpit_lite.diagnosis"``, level WARNING), kept
                in ``findings`` and written to the log. ``False``: none of that.
            budget: an overhead budget, e.g. ``1.25`` or ``cockpit_lite.budget.Budget(1.25,
                horizon=500)``: the average step time stays within that multiple of the
                plain step's, by spacing out the expensive quantities on schedules measured
                on the first steps; it takes over every tracked quantity's schedule and
                records the plan under ``"budget"`` (see ``cockpit_lite.budget``).
                ``None``: each quantity keeps its own schedule (every step by default).
            accumulate: gradient accumulation: ``cp(step)`` is entered around *every*
                micro-batch's backward pass with the same ``step``, and every quantity
                describes the effective batch the optimizer steps with (all micro-batches,
                ``B = Σ_m B_m``; ``cockpit_lite.engine.window``). A step is complete when
                ``info["optimizer"]`` steps (its step pre-hook; with ``step(closure)``,
                after the closure's backward pass), else at the next step's ``cp`` or at
                ``close()``; its record appears then, and the buffers of its BackPACK
                extensions stay on the parameters until then. The micro-batches'
                individual gradients are kept until the step completes (the memory of one
                backward pass of the effective batch). Curvature (BackPACK's diagonals,
                Hessian-vector products) of a step of several micro-batches is NaN with a
                flag. ``info["optimizer"]`` is required at every step.
            samples: ``k``: at a tracked step whose batch holds more than ``k`` samples, the
                per-sample quantities are estimated from ``k`` samples drawn without
                replacement (the Cockpit's own generator, seeded by ``(seed, step)``; the
                user's random state is untouched), with their standard errors in the
                record's ``meta`` (``cockpit_lite.subsample``). Individual gradients are
                formed for those ``k`` samples only (BatchNorm in training mode: ``k``
                backward passes instead of ``B``); the batch gradient stays exact. A
                quantity without an estimator (``Quantity.SUBSAMPLE``) is NaN with a flag
                at such steps. ``None`` (default), or ``k`` at least the batch size: exact,
                as without it. Not combined with ``accumulate=True`` or ``DistributedDataParallel``
                (on a model sharded by FSDP2 the subsample is drawn from the global batch).

        Raises:
            ValueError: if no parameter requires a gradient, for a ``samples`` that
                is not an integer of at least 2 or is combined with accumulation or DDP, and
                for a model distributed in a way the Cockpit cannot describe
                (``cockpit_lite.distributed.group_for``), each naming the fix.
        """
        self.model = params if isinstance(params, torch.nn.Module) else None
        if self.model is not None and type(self.model).__name__ == "OptimizedModule":
            raise ValueError(
                "cockpit-lite cannot watch a torch.compile'd model (its hooks would be "
                "compiled away or break the graph). Fix: give the Cockpit the original "
                "module, Cockpit(model, ...), and use it uncompiled on the tracked steps "
                "(compiled = torch.compile(model) shares its parameters, for the other steps)."
            )
        if self.model is None:
            params = list(params)
        self.group = _distributed.group_for(self.model, params)
        if accumulate and self.group is not None and self.group.sharded:
            raise ValueError(
                "Cockpit(accumulate=True) on a model sharded by FSDP2: the micro-batches' individual gradients "
                "would have to be kept, unsharded, until the optimizer steps, which the sharding is there to "
                "avoid. Fix: accumulate=False, with tracked steps of one backward pass each (e.g. "
                "gradient_accumulation_steps=1 or accumulate_grad_batches=1 on the tracked runs)"
            )
        self.samples = _checked_samples(samples, accumulate, self.group)
        if isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            self.model = params = self.model.module  # hooks and names on the module DDP runs
        self.names, self.params = _named_trainable(params)
        self.engine = Engine(self.model, self.params, self.names, self.group)
        self._found_watched = False  # parameters only: whether the signals watch the found model
        self._jumped = False
        self.quantities = []
        for quantity in quantities or []:
            self.add(quantity)
        self._diagnosis, self._undiagnosed = None, set()
        if diagnose:  # (under torch.distributed every rank computes the signals of its samples, rank 0 diagnoses)
            if self.group is None or self.group.main:
                self._diagnosis = _diagnosis.Diagnosis(self.names, [tuple(p.shape) for p in self.params])
            tracked = {q.name for q in self.quantities}
            for name in _diagnosis.SIGNALS:
                if name not in tracked:
                    self.add(REGISTRY[name](**_diagnosis.SIGNAL_OPTIONS.get(name, {})))
        self.budget = _budget.as_budget(budget)
        if self.budget is not None:
            self.budget.take_over(self.quantities, self.group)
        self.output = {}
        self.strict = strict
        self.seed = seed
        self._last_step = None
        self.accumulate = bool(accumulate)
        self._accumulating = None  # the context of an accumulated step whose micro-batches are still coming
        self._completed_step = None  # the last accumulated step completed by its optimizer's step
        self._open_step = None  # the step whose context was entered and not exited yet
        self._noted = set()  # changes of the tracked set already said (``_reread_parameters``)
        self._known_names = set(self.names)  # trainable ones not among them are said once (added, unfrozen)
        self._closed = False
        self._writer = None
        self.sinks = list(sinks)
        if log is not None and (self.group is None or self.group.main):  # rank 0 writes
            header = {
                "params": [
                    {"name": n, "shape": list(p.shape)} for n, p in zip(self.names, self.params)
                ],
                "quantities": [q.name for q in self.quantities],
            }
            self._writer = _log.JSONLinesWriter(log, header, strict=strict)

    def add(self, quantity):
        """Track one more ``Quantity``.

        Raises:
            ValueError: if it is not a ``Quantity`` or one of its class is tracked already.
        """
        if not isinstance(quantity, Quantity):
            raise ValueError(
                f"quantities must be cockpit_lite.quantities.Quantity instances, got {quantity!r}"
            )
        if not hasattr(quantity, "output"):
            raise ValueError(
                f"{type(quantity).__name__}.__init__ did not call Quantity.__init__: "
                "call super().__init__(track_schedule, verbose) in it"
            )
        if any(q.name == quantity.name for q in self.quantities):
            raise ValueError(f"{quantity.name} is tracked already; each class can be tracked once")
        if getattr(quantity, "_tracked_by_a_cockpit", False):
            raise ValueError(
                f"this {quantity.name} instance already belongs to another Cockpit, and its state "
                "(θ₀, histories, the last step's values) is that run's. Fix: give each Cockpit its "
                "own quantities, e.g. configuration(level) or [quantities.NormTest(), ...] built "
                "anew for every run of a sweep"
            )
        quantity._tracked_by_a_cockpit = True
        self.quantities.append(quantity)
        quantity.bind(self)
        if self.engine.model is not None:  # given, or found already (parameters only)
            quantity.watch(self.engine.model)

    def _watch_found_model(self):
        """Parameters only: once the engine found their model, the signals watch it too."""
        if self.model is None and not self._found_watched and self.engine.model is not None:
            self._found_watched = True
            for quantity in self.quantities:
                quantity.watch(self.engine.model)

    def create_graph(self, global_step):
        """``False``: ``loss.backward`` never needs to keep its graph (kept for Cockpit scripts).

        ``loss.backward(create_graph=cp.create_graph(step))`` is therefore a plain backward
        and may stay, or become ``loss.backward()``. The quantities that need
        Hessian-vector products (``HessMaxEV``, Hutchinson's estimator) take them before the
        user's backward pass from a gradient with graph of their own
        (``cockpit_lite.curvature.hvp``): ``create_graph=True`` alone changes the gradients
        in the last bit (PyTorch differentiates SiLU and others by other formulas then), so
        a Cockpit that asked for it would change training. A user who passes
        ``create_graph=True`` anyway gets the same values.
        """
        return False

    def __call__(self, global_step, *extensions, info=None, debug=False):
        """Return the context to run one step's ``loss.backward()`` in.

        Args:
            global_step: the step number; must increase from one call to the next.
            *extensions: extra BackPACK extensions, computed too and left on the
                parameters for the caller.
            info: dict with ``"loss"``, ``"optimizer"``, optionally
                ``"individual_losses"`` and ``"batch_size"`` (see ``cockpit_lite.info``).
            debug: print what the step computes (due quantities, transforms,
                extensions) and what it recorded (as Cockpit's ``debug``).

        Raises:
            ValueError: for a step that does not increase, a malformed extension, or a
                missing ``info`` key that a due quantity needs.
        """
        return StepContext(self, global_step, extensions, info, debug)

    def get_output(self):
        """The record ``{step: {quantity name: value, ...}}`` (see ``cockpit_lite.log``)."""
        return self.output

    def write(self, logpath):
        """Write the record to ``logpath + ".json"`` in Cockpit's layout (or ``logpath`` if it ends in .json)."""
        path = str(logpath)
        if not path.endswith(".json"):
            path += ".json"
        _log.write_json(path, self.output)
        return path

    def log(
        self,
        global_step,
        epoch_count,
        train_loss,
        valid_loss,
        test_loss,
        train_accuracy,
        valid_accuracy,
        test_accuracy,
        learning_rate,
    ):
        """Record epoch-level metrics at ``global_step`` (as Cockpit's ``log``).

        Raises:
            ValueError: after ``close()``.
        """
        self._check_open("log")
        values = dict(zip(_log.EPOCH_KEYS, (
            epoch_count, train_loss, valid_loss, test_loss,
            train_accuracy, valid_accuracy, test_accuracy, learning_rate,
        )))
        self._record(global_step, {k: _plain(v) for k, v in values.items()})
        self._diagnose()

    def close(self):
        """End tracking: remove the engine's forward hooks, close the JSON-lines log and the sinks.

        A closed Cockpit tracks nothing more (``cp(step)`` and ``log`` raise); its record
        stays readable. Closing twice does nothing.
        """
        if self._closed:
            return
        self.complete_step()
        self._closed = True
        self.engine.arm(False)
        if self.budget is not None:
            self.budget.unwatch(None, None, False)  # (closed during the budget's bare steps)
        self._diagnose(final=True)
        for quantity in self.quantities:
            quantity.unbind()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for sink in self.sinks:
            sink.close()

    def complete_step(self):
        """Record an accumulated step now (``accumulate=True``) if its micro-batches are still open.

        Normally not needed: the step completes when its optimizer steps, at the next
        step's ``cp`` or at ``close()``. Call it to read the record of the last step
        before any of these (e.g. right after its last micro-batch).
        """
        open_step, self._accumulating = self._accumulating, None
        if open_step is not None:
            open_step.complete()

    def state_dict(self):
        """What a resumed run needs to record, from the next step on, what this run would have.

        Plain tensors and Python values, so ``torch.save(cp.state_dict(), path)`` writes it
        and ``torch.load(path, weights_only=True)`` reads it (see ``cockpit_lite.state``):

        - ``"format"``, ``"version"``; ``"params"``: the tracked parameters' names and
          shapes (``load_state_dict`` checks them);
        - ``"quantities"``: every tracked quantity's ``state_dict()`` (its ``STATE``:
          ``Distance``'s θ₀, the pending first half of ``Alpha`` and ``UpdateSize``, the
          adapted histogram ranges, ``HessMaxEV``'s warm start and noise generator, the
          diagnosis signals' counters), by name;
        - ``"last_step"``, ``"jumped"``: the last step entered, and whether step numbers
          ever skipped one;
        - ``"record"``: the record from the last step entered on (values of two-step
          quantities and the diagnosis still need it; earlier steps are in the log), and
          ``"undiagnosed"``: its steps the diagnosis has not read yet;
        - ``"diagnosis"``: its running summaries, every rule's state and the findings
          made (``Diagnosis.state_dict``), or ``None`` with ``diagnose=False``;
        - ``"budget"``: the overhead budget's plan (``Budget.state_dict``), or ``None``;
        - ``"run"``: the log's run id (``None`` without a log), so that the resumed run
          continues the same run segment;
        - ``"noted"``, ``"known_names"``: the changes of the tracked set already said.

        Tensors are references, not copies (as ``Module.state_dict``'s); they are not
        changed in place later, so the dict stays a snapshot of this moment.

        Raises:
            ValueError: inside a step's context (save between steps), or for a custom
                quantity whose ``STATE`` holds something a state dict cannot (naming it).
        """
        if self._open_step is not None:
            raise ValueError(
                f"state_dict() inside the context of step {self._open_step}: the step is half done. Fix: save "
                "between steps, after the `with cp(step, ...):` block (e.g. with the model and optimizer)"
            )
        if self._accumulating is not None:
            raise ValueError(
                f"state_dict() while the micro-batches of step {self._accumulating.step} are accumulated "
                "(accumulate=True): the step is half done. Fix: save after optimizer.step(), or call "
                "cp.complete_step() first if no more micro-batches of that step follow"
            )
        settling = set(self._undiagnosed) | ({self._last_step} if self._last_step is not None else set())
        first = min(settling, default=None)
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "params": [[n, list(p.shape)] for n, p in zip(self.names, self.params)],
            "quantities": {q.name: q.state_dict() for q in self.quantities},
            "last_step": self._last_step,
            "jumped": self._jumped,
            "record": {s: e for s, e in self.output.items() if first is None or s >= first},
            "undiagnosed": sorted(self._undiagnosed),
            "diagnosis": self._diagnosis.state_dict() if self._diagnosis is not None else None,
            "budget": self.budget.state_dict() if self.budget is not None else None,
            "run": self._writer.run if self._writer is not None else None,
            "noted": sorted(self._noted),
            "known_names": sorted(self._known_names),
        }
        try:
            return _state.encode(state, self.params, "state_dict()")
        except TypeError as error:
            raise ValueError(f"cannot save the Cockpit's state: {error}") from None

    def load_state_dict(self, state):
        """Go on with the run that saved ``state`` (``state_dict()``'s dict, e.g. from ``torch.load``).

        Call it on a new Cockpit, created like the saved run's (the same model, quantities,
        ``diagnose`` and ``budget``), before its first step. Afterwards each quantity holds
        its saved state, the diagnosis reports no finding twice, the budget keeps its plan,
        the record holds the saved run's last step (later values of it arrive as in the
        uninterrupted run), and the log continues the saved run's segment: its header
        repeats the run id with ``"resumed_after": last step``, so readers return one run
        in which what the saved run recorded after that step is replaced by the resumed
        run's (see ``cockpit_lite.log``). Tensors move to the tracked parameters' devices.
        Under torch.distributed every rank may load rank 0's state (what Lightning saves):
        the other ranks take its quantities' states and leave its diagnosis and record.

        Raises:
            ValueError: for something other than a Cockpit state dict, another state
                version, other tracked parameters or quantities, another ``diagnose``
                or ``budget``, or a Cockpit that has recorded a step; each names the fix.
        """
        self._check_open("load_state_dict")
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"load_state_dict expects the dict Cockpit.state_dict() returned, got "
                f"{type(state).__name__}{' without its format' if isinstance(state, dict) else ''}. Fix: pass "
                "the Cockpit's state saved with the checkpoint (not the model's or the optimizer's)"
            )
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"the Cockpit state has version {state.get('version')!r}; this cockpit-lite reads version "
                f"{STATE_VERSION}. Fix: resume with the cockpit-lite version that saved it"
            )
        if self._last_step is not None or self.output:
            raise ValueError(
                "load_state_dict on a Cockpit that has recorded steps already: their values would mix with the "
                "saved run's. Fix: create a new Cockpit and load the state before its first step"
            )
        here = [[n, list(p.shape)] for n, p in zip(self.names, self.params)]
        saved = [[n, list(s)] for n, s in state["params"]]
        if saved != here:
            diff = next((i for i, (a, b) in enumerate(zip(saved, here)) if a != b), min(len(saved), len(here)))
            raise ValueError(
                f"the state was saved by a run tracking {len(saved)} parameters, this Cockpit tracks {len(here)}; "
                f"the first difference is at position {diff}: saved {saved[diff] if diff < len(saved) else None}, "
                f"here {here[diff] if diff < len(here) else None}. Fix: create the Cockpit over the same model "
                "(the same trainable parameters, in the same order and shapes) before loading"
            )
        main = self.group is None or self.group.main
        tracked, kept = {q.name for q in self.quantities}, set(state["quantities"])
        if not main:  # another rank keeps no record: rank 0's state serves it
            state = {**state, "diagnosis": None, "record": {}, "undiagnosed": []}
        if tracked != kept:
            raise ValueError(
                f"the saved run tracked {sorted(kept - tracked)} which this Cockpit does not, and this Cockpit "
                f"tracks {sorted(tracked - kept)} which the saved run did not. Fix: create the resumed Cockpit "
                "with the same quantities (and diagnose=, which adds the diagnosis signals) as the saved run"
            )
        for key, here_on in (("diagnosis", self._diagnosis is not None), ("budget", self.budget is not None)):
            if (state[key] is not None) != here_on:
                option = "diagnose" if key == "diagnosis" else "budget"
                raise ValueError(
                    f"the saved run had {'a' if state[key] is not None else 'no'} {key}, this Cockpit has "
                    f"{'one' if here_on else 'none'}. Fix: create the resumed Cockpit with the saved run's {option}="
                )
        state = _state.decode(state, self.params)
        for quantity in self.quantities:
            quantity.load_state_dict(state["quantities"][quantity.name])
        if self._diagnosis is not None:
            self._diagnosis.load_state_dict(state["diagnosis"])
        if self.budget is not None:
            self.budget.load_state_dict(state["budget"])
        self.output = {int(step): entry for step, entry in state["record"].items()}
        self._undiagnosed = {int(step) for step in state["undiagnosed"]}
        self._last_step, self._jumped = state["last_step"], bool(state["jumped"])
        self._noted = {tuple(key) for key in state["noted"]}
        self._known_names = set(state["known_names"])
        if self._writer is not None and state["run"] is not None:
            self._writer.resume(state["run"], self._last_step)
        if self._last_step is not None:  # watch the next step's forward pass as the saved run would have
            nxt = self._last_step + 1
            self.engine.arm(self._jumped or any(q.observes(nxt) for q in self.quantities))

    def _reread_parameters(self, step):
        """The tracked set as it is at this step, re-read from the model (or the given list).

        A parameter frozen since (``requires_grad_(False)``) drops out of every statistic
        (zero gradient, no individual gradients); one the model's attribute now holds
        another tensor for (``layer.weight = nn.Parameter(...)``) is tracked as that tensor,
        by name; a trainable parameter added to the model (or unfrozen) after the Cockpit
        was created is not tracked (the record's layers are fixed at construction). Each is
        said once.
        """
        if self.model is not None:
            unsharded = self.group.unsharded(self.model) if self.group is not None else {}
            current = {n: unsharded.get(id(p), p) for n, p in self.model.named_parameters()}  # (FSDP2: the sharded ones)
            for index, name in enumerate(self.names):
                param = current.get(name)
                if param is not None and param is not self.params[index]:
                    self.engine.replace(index, param)
                    self._note(("replaced", name), f"{name} was replaced by a new tensor: from step {step} on "
                               "its statistics are the new tensor's (quantities with a memory of it, like "
                               "Distance, compare against the old one's)")
            added = [n for n, p in current.items() if p.requires_grad and n not in self._known_names]
            if added:
                self._known_names.update(added)
                self._note(("added", *added), f"{', '.join(added)} joined the model or became trainable after "
                           "the Cockpit was created and are not tracked. Fix: create the Cockpit once the model "
                           "is complete, with every parameter to track trainable")
        for index, param in enumerate(self.params):
            if not param.requires_grad:
                self._note(("frozen", self.names[index]), f"{self.names[index]} no longer requires a gradient: "
                           f"from step {step} on it is left out of every statistic (zero gradient, zero "
                           "individual gradients)")

    def _note(self, key, message):
        if key not in self._noted:
            self._noted.add(key)
            warnings.warn(f"cockpit-lite: {message}", stacklevel=5)

    def _check_open(self, what):
        if self._closed:
            raise ValueError(
                f"{what}: this Cockpit was closed, so nothing more would reach its log or sinks. "
                "Fix: call close() once, after the last step; for another run create a new "
                "Cockpit (with new quantities)"
            )

    @property
    def findings(self):
        """The diagnosis findings so far (``list[Finding]``; empty with ``diagnose=False``), causes
        first: each root followed by the findings it probably caused (``diagnosis.precedence``)."""
        if self._diagnosis is None:
            return []
        self._diagnose()
        probe = copy.deepcopy(self._diagnosis)  # the newest step may still get values: look, don't settle
        probe.feed_record({s: self.output[s] for s in self._undiagnosed if s in self.output})
        return [f for f, _ in _precedence.ordered(probe.findings)]

    def report(self):
        """Print (and return) the diagnosis report: findings, then per-layer statistics."""
        text = _diagnosis.format_report(self.findings, self.output, self.names)
        print(text)
        return text

    def _diagnose(self, final=False):
        """Feed the settled steps (all but the newest, unless ``final``) to the live diagnosis."""
        if self._diagnosis is None or not self._undiagnosed:
            return
        newest = max(self._undiagnosed)
        for step in sorted(self._undiagnosed):
            if step == newest and not final:
                break
            self._undiagnosed.discard(step)
            new, failed = self._diagnosis.feed(step, self.output[step])
            for finding in new:
                _diagnosis.LOGGER.warning("cockpit-lite: %s", finding)
                self._record(finding.step, {_log.FINDINGS: [finding.to_dict()]})
            if failed:
                self._record(step, {_log.FLAGS: failed})

    def _record(self, step, entries):
        if self.group is not None and not self.group.main:
            return  # under torch.distributed, rank 0 keeps the record
        _log.merge(self.output, step, entries)
        if self._diagnosis is not None and (self._diagnosis.last is None or step > self._diagnosis.last):
            self._undiagnosed.add(int(step))
        if self._writer is not None:
            self._writer.append(step, entries)
        for sink in self.sinks:
            try:
                sink.write(step, entries, self.names)
            except Exception as error:
                if self.strict:
                    raise
                warnings.warn(f"sink {type(sink).__name__} failed at step {step}: {error!r}", stacklevel=3)


def _named_trainable(params):
    """Return ``(names, params)`` of the trainable parameters in ``params``."""
    if isinstance(params, torch.nn.Module):
        items = list(params.named_parameters())
    else:
        items = list(params)
        if items and isinstance(items[0], tuple):
            items = [(str(n), p) for n, p in items]
        else:
            items = [(f"param_{i}", p) for i, p in enumerate(items)]
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"expected parameters (tensors), got {type(p).__name__} for {name}")
    frozen = [n for n, p in items if not p.requires_grad]
    trainable = [(n, p) for n, p in items if p.requires_grad]
    if not trainable:
        raise ValueError("none of the parameters requires a gradient: nothing to track")
    if frozen:
        warnings.warn(
            f"{len(frozen)} parameter(s) with requires_grad=False are not tracked: "
            f"{', '.join(frozen[:5])}{'...' if len(frozen) > 5 else ''}. Pass only "
            "trainable parameters to silence this.",
            stacklevel=3,
        )
    return [n for n, _ in trainable], [p for _, p in trainable]


def _plain(value):
    """A host tensor or number as a Python number (0-d) or numpy array."""
    if torch.is_tensor(value):
        value = value.detach().cpu()
        if value.dim() == 0:
            return value.item()
        return value.numpy()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _checked_samples(samples, accumulate, group):
    """``Cockpit(samples=...)`` validated: ``None`` or an integer of at least ``subsample.MIN_SAMPLES``."""
    if samples is None:
        return None
    if not isinstance(samples, numbers.Integral) or isinstance(samples, bool) or samples < _subsample.MIN_SAMPLES:
        raise ValueError(
            f"samples must be an integer of at least {_subsample.MIN_SAMPLES} (a standard error needs a "
            f"variance across the subsample), got {samples!r}. Fix: e.g. Cockpit(model, samples=8), or "
            "samples=None for exact values"
        )
    if accumulate or (group is not None and not group.sharded):
        raise ValueError(
            f"samples={samples} is not combined with "
            + ("accumulate=True (gradient accumulation; the Lightning callback and the Hugging Face trainer set it "
               "when accumulate_grad_batches or gradient_accumulation_steps is above 1)" if accumulate else
               "torch.distributed (DistributedDataParallel)")
            + " (the subsample would have to be drawn across micro-batches or ranks). Fix: samples=None "
            "there (exact values)"
        )
    return int(samples)
