"""The context of one step (``StepContext``, what ``cp(step)`` returns): it plans what is due before the
backward pass, arms the engine and BackPACK, and records the step once it is complete (see
``cockpit_lite.cockpit``)."""

import math
import numbers
import time
import warnings
from contextlib import ExitStack, contextmanager, nullcontext

import torch
from backpack import backpack
from backpack.extensions.backprop_extension import BackpropExtension

from cockpit_lite import distributed as _distributed
from cockpit_lite import log as _log
from cockpit_lite import sharded as _sharded
from cockpit_lite import subsample as _subsample
from cockpit_lite.backend import add_advice, backpack_untouched, uses_random_numbers
from cockpit_lite.curvature.hvp import HessianVectorProducts
from cockpit_lite.engine.global_path import kept_buffers
from cockpit_lite.engine.window import Window
from cockpit_lite.info import StepInfo
from cockpit_lite.quantities.base import Needs, Output
from cockpit_lite.step import StepData
from cockpit_lite.utils.grads import held
from cockpit_lite.utils.shards import group_of, local, whole

NONFINITE_LOSS = "nonfinite_loss"
NONFINITE_GRAD = "nonfinite_grad"


class StepContext:
    """Runs one step: plan before backward, collect and record after it.

    Under gradient accumulation (``Cockpit(accumulate=True)``) the first context of a
    step plans it and holds its window; the contexts of its further micro-batches
    (``owner``) add their backward passes to it, and the owner records the step once it
    is complete (``complete``: the optimizer's step pre-hook, the next step, ``close``).
    """

    bare = False  # a bare step of the overhead budget's calibration: nothing of the Cockpit runs

    def __init__(self, cockpit, step, extensions, info, debug=False):
        began = time.perf_counter()
        if not isinstance(step, numbers.Integral) or isinstance(step, bool):
            raise ValueError(f"global_step must be an integer, got {step!r}")
        step = int(step)
        cockpit._check_open(f"cp({step})")
        if cockpit._open_step is not None:
            raise ValueError(
                f"cp({step}) was called while the context of step {cockpit._open_step} is still "
                "open (entered, never exited: nested, or __enter__ called by hand). Fix: run each "
                "step's backward in its own `with cp(step, info=...): loss.backward()` block, "
                "one after the other"
            )
        owner = cockpit._accumulating
        if owner is not None and owner.step != step:  # its optimizer never stepped (or is not hooked)
            cockpit.complete_step()
            owner = None
        last = cockpit._last_step
        if cockpit.accumulate and step == cockpit._completed_step:
            raise ValueError(
                f"cp({step}) after step {step} was completed by optimizer.step(): a micro-batch "
                "after the optimizer stepped belongs to the next step. Fix: number the steps by "
                "optimizer steps (e.g. step = batch_index // accumulation)"
            )
        if last is not None and (step < last or (step == last and not cockpit.accumulate)):
            raise ValueError(
                f"global_step must increase from one call to the next: got {step} after "
                f"{last}. Use one Cockpit per training run and count steps across epochs"
                + (". For gradient accumulation (several backward passes per optimizer step), "
                   "create the Cockpit with accumulate=True and enter cp(step) around every "
                   "micro-batch's backward with the same step" if step == last else ".")
            )
        for ext in extensions:
            if not isinstance(ext, BackpropExtension):
                raise ValueError(f"extra extensions must be BackPACK extension instances, got {ext!r}")
        self.cockpit = cockpit
        self.step = step
        self.debug = debug
        self.entered = False
        self.owner = owner  # the first context of this accumulated step, or None (this is the first)
        if last is not None and step != last:  # jumped: watch every forward pass until the numbers run on by one
            cockpit._jumped = step > last + 1  # (a run resumed at another step, or a cp(step) only every k steps)
        if cockpit.budget is not None and owner is None and (
                self._timed(step, info, began) if step != last else cockpit.budget.bare(step)):
            self.idle, self.bare, self.due = True, True, []  # a bare step (its every micro-batch)
            return
        # the step's own forward calls (given parameters only: the modules that own them, too)
        cockpit.engine.prepare(info.get("loss") if isinstance(info, dict) else None)
        cockpit._watch_found_model()
        self.info = StepInfo(info, step, batch_size=cockpit.engine.batch_size(), model=cockpit.engine.model)
        if self.info.batch_size == 0:
            raise ValueError(
                f"step {step}: the batch is empty (0 samples), so there is nothing to measure. " + (
                    "Fix: skip empty batches before the forward pass (e.g. DataLoader(..., "
                    "drop_last=True), or `if len(x) == 0: continue`)" if cockpit.group is None else
                    "Under torch.distributed every rank's part of the batch needs a sample (a rank that skipped "
                    "its step would leave the others waiting). Fix: split the data with torch.utils.data."
                    "distributed.DistributedSampler, which gives every rank the same number of samples, and "
                    "drop the incomplete last batch (DataLoader(..., sampler=sampler, drop_last=True))")
            )
        shape = cockpit.engine.input_shape()
        if self.info.get("batch_size") is not None and shape is not None and int(self.info.get("batch_size")) not in shape:
            raise ValueError(
                f"info['batch_size'] is {self.info.get('batch_size')} but the model's input at "
                f"step {step} has shape {shape}: pass the number of samples of this forward pass"
            )
        if cockpit.accumulate:  # the step is complete when its optimizer steps
            self.optimizer = self.info.require("optimizer", "Cockpit(accumulate=True)")
        if cockpit.samples is not None and step != last:
            self._subsample(cockpit.samples)
        if owner is not None:
            self._join(owner)
            return
        self.due = [(q, n) for q in cockpit.quantities if (n := q.needs(step, self.info))] if step != last else []
        if cockpit.group is not None and all(q.RANK_LOCAL for q, _ in self.due):  # (the ranks may disagree on these)
            self.due = []
        self.unsampled = set()  # due quantities without an estimate from this step's subsample: NaN
        if self.info.subset is not None:
            self.unsampled = {q for q, n in self.due if n.transforms and not q.SUBSAMPLE}
            self.due = [(q, Needs() if q in self.unsampled else n) for q, n in self.due]
        self.refused = {}  # FSDP2: quantity -> why it is NaN (``cockpit_lite.sharded``)
        if cockpit.group is not None and cockpit.group.sharded:
            for q, n in self.due:
                unshardable = [t.key for t in n.transforms if not t.shardable]
                if n.extensions or unshardable:
                    self.refused[q] = (_sharded.UNSUPPORTED_BACKPACK if n.extensions
                                       else _sharded.UNSHARDABLE.format(keys=", ".join(unshardable)))
            self.due = [(q, Needs() if q in self.refused else n) for q, n in self.due]
        if self.due:
            cockpit._reread_parameters(step)
        if cockpit.budget is not None and step != last:
            cockpit.budget.saw(step, self.due)
        cockpit._last_step = step
        self.idle = not (self.due or extensions)
        if self.idle:  # nothing to do at this step: keep it as cheap as possible
            self.transforms, self.extensions, self._backpack = [], [], None
            return
        self.user_savefields = {ext.savefield for ext in extensions}

        transforms = {}
        exts = {type(ext): ext for ext in extensions}
        for _, needs in self.due:
            for t in needs.transforms:
                transforms.setdefault(t.key, t)
            for ext in needs.extensions:
                exts.setdefault(type(ext), ext)
        self.transforms = list(transforms.values())
        self.needed_by = [q.name for q, n in self.due if n.transforms]
        self.extensions = list(exts.values())
        self.added_savefields = {
            e.savefield for e in self.extensions if e.savefield not in self.user_savefields
        }
        self.grads_before = None
        self.grads_after = None
        self._loss_hook, self.backward_seen, self.seed = None, False, None
        self.results, self.batch_size, self.engine_flags = {}, None, []
        self.noise = set()  # the parameters whose gradient was zero up to rounding (``Engine.noise``)
        self.diagonals = {}  # ``Needs.diagonals``' request -> its diagonal (or the error it raised)
        self.passes = []  # the infos of the step's backward passes (several under accumulation)
        self.seeds = []  # each pass's σ (``_reached``), None where the loss hook did not fire
        self.missed = []  # the passes whose backward did not run through their info['loss']
        self.window = None  # the engine's Window (accumulate=True)
        self.closing = False  # the optimizer is stepping with a closure: complete after its backward
        self._hooks = []
        self._stack = ExitStack()
        self._backpack = None
        if debug:
            print(
                f"[cockpit-lite | step {step}] due: {[q.name for q, _ in self.due]}; transforms: "
                f"{[t.key for t in self.transforms]}; extensions: {[type(e).__name__ for e in self.extensions]}; "
                f"Hessian-vector products: {[q.name for q, n in self.due if n.hvp]}"
            )

    def _timed(self, step, info, began):
        """The step's period starts now: the budget times it (and records a plan made now). Returns
        whether the step is bare (``cockpit_lite.budget``): then nothing of the Cockpit runs in it,
        and its hooks stay off the model and the optimizer while the next step is bare too; the budget
        is told how long this call took since ``began`` (``time.perf_counter()``), its own time in the
        bare step's period."""
        cockpit = self.cockpit
        plan = cockpit.budget.step_started(step, time.perf_counter())
        if plan is not None:
            cockpit._record(step, {_log.BUDGET: plan})
        if not cockpit.budget.bare(step):
            cockpit.budget.unwatch(None, None, False)  # (after steps skipped past bare ones)
            return False
        optimizer = info.get("optimizer") if isinstance(info, dict) else None
        cockpit.budget.unwatch(cockpit.engine.model, optimizer, cockpit.budget.bare(step + 1))
        cockpit._last_step = step
        cockpit.budget.took(step, time.perf_counter() - began)
        return True

    def _subsample(self, k):
        """Draw the step's subsample (``info.subset``) when its batch holds more than ``k`` samples (FSDP2:
        of the global batch; each rank takes the drawn samples it holds, ``ShardedGroup.subset_of``)."""
        size = self.info.batch_size
        group = self.cockpit.group
        if size is not None and group is not None and group.sharded:
            size = sum(group.batch_sizes(size))
        if size is None:
            self.cockpit._note("samples", (
                f"Cockpit(samples={k}) cannot draw a subsample at step {self.step}: the batch size is "
                "not known before the backward pass, so the step is exact. Fix: pass info['batch_size']"
            ))
        elif size > k:
            device = self.cockpit.params[0].device if self.cockpit.params else None
            self.info.subset = _subsample.draw(k, size, (self.cockpit.seed, self.step), device)

    def _join(self, owner):
        """A further micro-batch of ``owner``'s accumulated step: its plan, this pass's own info."""
        for key in owner.info._cache:  # what the owner's quantities resolved before its backward pass
            self.info.require(key, "gradient accumulation")
        for name in ("due", "idle", "transforms", "needed_by", "extensions", "added_savefields", "user_savefields"):
            setattr(self, name, getattr(owner, name))
        self._loss_hook, self.backward_seen, self.seed = None, False, None
        self._stack = ExitStack()
        self._backpack = None

    def __enter__(self):
        if self.entered:
            raise ValueError(
                f"the context of step {self.step} was entered twice. Fix: one "
                "`with cp(step, info=...):` per step, with a new cp(step) each time"
            )
        if self.cockpit._open_step is not None:
            raise ValueError(
                f"the context of step {self.step} was entered inside the open context of step "
                f"{self.cockpit._open_step}. Fix: exit one step's context before entering the next"
            )
        self.entered = True
        if self.idle:
            self.cockpit._open_step = self.step
            return self
        owner = self.owner or self
        params = self.cockpit.params
        self.grads_before = [held(p, copy=True) for p in params]
        # BackPACK's full backward hooks fire in the Cockpit's own passes (the products below, the
        # user's backward inside the context) with "Full backward hook is firing ... no inputs
        # require gradients": exactly that message is silenced, and only inside this context
        self._stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        try:
            with kept_buffers(self.cockpit.engine.model):  # (a checkpointed BatchNorm recomputed in these passes)
                if self.owner is None:
                    self._products()  # first: no hook of this step exists yet (the engine begins below), no BackPACK
                    self._diagonals()  # the engine's pseudo-loss passes, before its pass of the user's backward
                    if self.cockpit.accumulate and self.transforms:
                        self.window = Window(self.grads_before)
                if self.transforms:  # (the global path's passes are the Cockpit's own too)
                    with backpack_untouched(), _own_passes(self.cockpit.group, self.info.model, [], whole=False):
                        self.cockpit.engine.begin(
                            self.transforms, self.info, self.info.batch_size, self.grads_before, self.needed_by,
                            owner.window,
                        )
            if any(uses_random_numbers(e) for e in self.extensions if e.savefield in self.added_savefields):
                key = (self.cockpit.seed, self.step) + ((len(owner.passes),) if owner.passes else ())
                self._stack.enter_context(_private_random_state(self.cockpit.params, key))
            if self.extensions:
                self._backpack = backpack(*self.extensions)
                self._backpack.__enter__()
            loss = self.info.get("loss")
            if torch.is_tensor(loss) and loss.requires_grad:  # did the backward pass run through it?
                self._loss_hook = loss.register_hook(self._reached)
        except BaseException:  # a refusal leaves no filter or private random state behind
            self._stack.close()
            raise
        self.cockpit._open_step = self.step  # open only once entered (a refusal above leaves nothing open)
        return self

    def _products(self):
        """The Hessian-vector products of the quantities whose ``Needs`` ask for them (``Needs.hvp``).

        Before the user's backward pass, which frees the forward graph, and before the
        engine's step state and this step's hooks exist (its gradient hooks on the module
        outputs see no step and do nothing), past BackPACK's hooks: one gradient with graph
        (``cockpit_lite.curvature.hvp``) serves them all and is dropped afterwards, so the
        user's ``loss.backward()`` stays plain. A quantity's error is kept and raised again
        when its value is computed. Under torch.distributed every rank forms the products of its
        own loss and one all-reduce per product averages them (FSDP2: with the whole parameters,
        ``ShardedGroup.own_passes``); every rank runs the same quantities on the same products.
        """
        self.product_errors = {}
        wanting = [q for q, n in self.due if n.hvp]
        if not wanting:
            return
        group, params = self.cockpit.group, self.cockpit.params
        with _own_passes(group, self.info.model, params, whole=True) as leaves:
            products = HessianVectorProducts(self.info.get("loss"), leaves, self.step, self.info.model, group, params)
            try:
                with backpack_untouched():
                    for quantity in wanting:
                        try:
                            quantity.before_backward(self.step, products)
                        except Exception as error:
                            self.product_errors[quantity] = error
            finally:
                products.release()

    def _diagonals(self):
        """The curvature diagonals the engine computes for the due quantities (``Needs.diagonals``),
        each once: its pseudo-loss passes run through the step's graph before the user's backward
        pass (``cockpit_lite.curvature.ggn``), past BackPACK's hooks. An error is kept and raised
        again when a quantity reads the diagonal. Under accumulation, the first backward pass's.
        FSDP2 gathers each layer's parameters in every pass (``ShardedGroup.own_passes``)."""
        wanting = [(q, n) for q, n in self.due if n.diagonals and q not in self.refused]
        requests = list(dict.fromkeys(r for _, n in wanting for r in n.diagonals))
        if not requests:
            return
        needed_by = ", ".join(q.name for q, _ in wanting)
        with _own_passes(self.cockpit.group, self.info.model, self.cockpit.params, whole=False):
            for request in requests:
                try:
                    with backpack_untouched():
                        self.diagonals[request] = request.compute(self.cockpit.engine, self.info, needed_by)
                except Exception as error:
                    self.diagonals[request] = error

    def _reached(self, grad):
        self.backward_seen = True
        self.seed = grad.detach()  # σ = ∂(loss backpropagated)/∂info["loss"]: 1 unless the loss was scaled

    def __exit__(self, exc_type, exc, traceback):
        cockpit = self.cockpit
        cockpit._open_step = None
        if self.idle:
            if not self.bare:
                cockpit.engine.forget()
                self._arm()
            return False
        owner = self.owner or self
        if self._backpack is not None:  # leave BackPACK before computing (HVPs must not trigger it)
            self._backpack.__exit__(exc_type, exc, traceback)
        if self._loss_hook is not None:
            self._loss_hook.remove()
        broken = False
        try:
            if self.transforms:
                with backpack_untouched():
                    results, batch_size, flags = cockpit.engine.finish()
                owner.engine_flags.extend(flags)
                owner.noise |= cockpit.engine.noise
                if owner.window is None:
                    owner.results, owner.batch_size = results, batch_size
            if exc is not None:
                if self._backpack is not None:
                    add_advice(exc, [q.name for q, _ in self.due])
                if cockpit._accumulating is owner:  # the step is broken: nothing of it is recorded
                    cockpit._accumulating = None
                    owner._unhook()
                broken = True
                return False
            self._end_pass(owner)
            if not cockpit.accumulate or owner.closing:
                cockpit._accumulating = None
                owner.complete()
            else:
                cockpit._accumulating = owner
                if self.owner is None:
                    owner._hook_optimizer()
        finally:
            cockpit.engine.forget()
            self._arm()
            self._stack.close()
            if broken or not cockpit.accumulate:
                owner._cleanup()
        return False

    def _arm(self):
        """Watch the next forward pass if anything needs it (this step's next micro-batch does)."""
        cockpit = self.cockpit
        nxt = self.step + 1
        cockpit.engine.arm(
            cockpit._jumped or cockpit._accumulating is not None or any(q.observes(nxt) for q in cockpit.quantities)
        )
        if cockpit.budget is not None and cockpit._accumulating is None and cockpit.budget.bare(nxt):
            cockpit.budget.unwatch(cockpit.engine.model, self.info.get("optimizer"), True)  # (the budget's)

    def _end_pass(self, owner):
        """After one backward pass: check it; keep its info and the gradient it left."""
        no_backward = self._loss_hook is not None and not self.backward_seen
        if no_backward:
            owner.missed.append(len(owner.passes))
        elif self.transforms:
            if owner.window is None:
                served = set(owner.results)
            else:
                number = owner.window.passes - 1
                served = {i for i, parts in owner.window.parts.items() if number in parts} | owner.window.failed
            self._check_backward(self.cockpit.params, served)
        owner.passes.append(self.info)
        owner.seeds.append(self.seed)
        if self.cockpit.accumulate:
            owner.grads_after = [held(p, copy=True) for p in self.cockpit.params]

    def _hook_optimizer(self):
        """``accumulate=True``: complete the step when its optimizer steps."""
        self._hooks = [
            self.optimizer.register_step_pre_hook(self._optimizer_steps),
            self.optimizer.register_step_post_hook(self._optimizer_stepped),
        ]

    def _unhook(self):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _optimizer_steps(self, optimizer, args, kwargs):
        """Step pre-hook: the step is complete, unless a closure runs its last micro-batch now."""
        if self.cockpit._accumulating is not self:
            return
        if any(callable(a) for a in args[1:]) or callable(kwargs.get("closure")):  # args[0]: the optimizer
            self.closing = True  # completed when the closure's cp(step) exits
            return
        self.cockpit._accumulating = None
        self.complete()

    def _optimizer_stepped(self, optimizer, args, kwargs):
        """Step post-hook: a closure that ran no tracked backward pass still completes the step."""
        if self.cockpit._accumulating is self:
            self.cockpit._accumulating = None
            self.complete()

    def complete(self):
        """Record the step (all its backward passes); the hooks and buffers of the step go."""
        cockpit = self.cockpit
        try:
            if cockpit.accumulate:
                cockpit._completed_step = self.step
            if self.window is not None:
                with backpack_untouched():
                    self.results, self.batch_size, flags = cockpit.engine.complete(
                        self.window, self.transforms, self.grads_after
                    )
                self.engine_flags.extend(flags)
                self.window = None
            if len(self.passes) > 1:
                self.info = StepInfo.merged(self.passes)
            if self.due:
                self._collect()
        finally:
            if cockpit.accumulate:
                self._unhook()
                self._cleanup()
                self._arm()

    def _collect(self):
        cockpit = self.cockpit
        params = cockpit.params
        no_backward = bool(self.missed)
        flags = list(self.engine_flags)
        if no_backward:
            reason = (
                f"no backward pass of info['loss'] ran inside cp({self.step}): the quantities "
                "that need it are NaN. Fix: call loss.backward() inside the `with cp(step, "
                "info={'loss': loss, ...}):` block, on the loss passed as info['loss'] (or on a "
                "total that contains it)"
            )
            warnings.warn(f"cockpit-lite: step {self.step}: {reason}", stacklevel=4)
            flags.append(reason)
        if cockpit.group is not None:
            self._combine_ranks()
            if cockpit.group.precision is not None and self.transforms:
                flags.append(cockpit.group.precision)
        batch_size = self.batch_size if self.batch_size is not None else self.info.batch_size
        given = self.info.get("batch_size")
        sharded = cockpit.group is not None and cockpit.group.sharded and self.batch_size is not None
        held = cockpit.group.sizes[cockpit.group.rank] if sharded else batch_size  # (FSDP2: this rank's part)
        if given is not None and held is not None and int(given) != held:
            raise ValueError(
                f"info['batch_size'] is {given} but the individual gradients have "
                f"batch size {batch_size} at step {self.step}"
            )
        data = StepData(
            self.step, params, cockpit.names, self.info, self.results, batch_size,
            self.transforms, self.grads_before, cockpit.group, cockpit.engine.pass_grads, self.grads_after,
            self.diagonals, self.noise,
        )
        if not cockpit.accumulate and self.transforms and _held_gradients(self.grads_before):
            cockpit._note("accumulated", (
                f"at step {self.step} the parameters held gradients of earlier backward passes (gradient "
                "accumulation, or a missing zero_grad): every quantity describes this backward pass's "
                f"{batch_size} sample(s), not the batch the optimizer steps with. For accumulation, "
                "Cockpit(..., accumulate=True) with `with cp(step, ...)` around every micro-batch's "
                "backward (the same step) measures the optimizer's effective batch"
            ))
        several = len(self.passes) > 1
        outputs, too_few = [], []
        for quantity, needs in self.due:
            if no_backward and quantity.NEEDS_BACKWARD:
                outputs.append((quantity, Output(float("nan"))))
                continue
            if batch_size is not None and batch_size < quantity.MIN_BATCH_SIZE:
                too_few.append(quantity.name)
                outputs.append((quantity, Output(float("nan"))))
                continue
            if quantity in self.refused:
                outputs.append((quantity, Output(float("nan"), flags=[f"{quantity.name}: {self.refused[quantity]}"])))
                continue
            if quantity in self.unsampled:
                outputs.append((quantity, Output(float("nan"), flags=[
                    f"{quantity.name}: no estimate from a subsample ({data.samples} of {batch_size} samples, "
                    f"Cockpit(samples={self.cockpit.samples})): NaN at subsampled steps. Fix: "
                    "Cockpit(samples=None) for its exact value"
                ])))
                continue
            if several and (needs.extensions or needs.hvp or needs.diagonals):
                outputs.append((quantity, Output(float("nan"), flags=[
                    f"{quantity.name}: the curvature of an accumulated step ({len(self.passes)} backward "
                    "passes) is not computed: it is NaN at such steps. Fix: track it on steps of one "
                    "backward pass (e.g. Cockpit(accumulate=False) on a run without accumulation)"
                ])))
                continue
            outputs.extend((quantity, out) for out in self._compute(quantity, data))

        loss = self.info.get("loss")
        checks = [_gradient_probe(data)]
        if torch.is_tensor(loss):
            checks.append(loss.detach().sum())
        seeds = [seed.reshape(()) for seed in self.seeds if seed is not None and seed.numel() == 1]
        host_outputs, checks, seeds = _to_host(([(o.value, o.layers, o.meta) for _, o in outputs], checks, seeds))
        scaled = _scaled_backward(seeds, cockpit.accumulate)
        reading = [q.name for q, _ in self.due if q.SCALED_BACKWARD]
        if scaled is not None and reading:
            reason = (
                f"the backward pass at step {self.step} was scaled by {scaled:.4g} relative to info['loss'] "
                f"(a GradScaler's scaler.scale(loss).backward(), or a scaled loss): {', '.join(reading)} "
                "describe the scaled gradient, not the one the optimizer steps with (the gradient tests and "
                "Alpha do not depend on the scale). Fix: divide GradNorm by the scale (scaler.get_scale()) "
                "and GradVariance by its square; no rescaling recovers the histograms, the curvature and "
                "the ratios with an epsilon: for those, backpropagate info['loss'] itself on tracked steps"
            )
            cockpit._note("scaled", reason)
            flags.append(reason)

        if too_few:
            flags.append(
                f"a batch of {batch_size} sample(s) has no variance across samples: "
                f"{', '.join(too_few)} are NaN at step {self.step}. Fix: batches of at least 2 samples"
            )
        if len(checks) > 1 and not math.isfinite(checks[1]):
            flags.append(NONFINITE_LOSS)
        if not math.isfinite(checks[0]):
            flags.append(NONFINITE_GRAD)
        by_step = {}
        for (quantity, out), (value, layers, meta) in zip(outputs, host_outputs):
            entries = by_step.setdefault(self.step if out.step is None else out.step, {})
            entries[quantity.name] = value
            quantity.output[self.step if out.step is None else out.step] = value
            if layers is not None:
                entries.setdefault(_log.LAYERS, {})[quantity.name] = layers
            if meta is not None:
                entries.setdefault(_log.META, {})[quantity.name] = meta
            if out.flags:
                entries.setdefault(_log.FLAGS, []).extend(out.flags)
            if quantity._verbose:
                print(f"[cockpit-lite | step {self.step}] {quantity.name}: {value}")
        if flags:
            by_step.setdefault(self.step, {}).setdefault(_log.FLAGS, []).extend(flags)
        if self.transforms and batch_size is not None:
            by_step.setdefault(self.step, {})[_log.BATCH] = {
                "size": int(batch_size), "accumulated": data.accumulated, "passes": len(self.passes),
            }
            if data.subset is not None:
                by_step[self.step][_log.BATCH]["samples"] = data.samples
        for step in sorted(by_step):
            cockpit._record(step, by_step[step])
            if self.debug:
                print(f"[cockpit-lite | step {self.step}] recorded at step {step}: {sorted(by_step[step])}")
        cockpit._diagnose()
        if flags and cockpit.strict:
            raise FloatingPointError(
                f"step {self.step}: {', '.join(flags)} (recorded; strict=True stops here)"
            )

    def _combine_ranks(self):
        """Under torch.distributed: the global batch's results, loss and individual losses.

        The loss DDP minimises is the mean of the ranks' losses; rank r's individual
        losses ``ℓ_n = B_r c_n`` become ``B c_n / W`` (see ``cockpit_lite.distributed``).
        """
        group = self.cockpit.group
        loss = self.info.get("loss")
        sums = [loss.detach().reshape(())] if torch.is_tensor(loss) else []
        losses = self.info._cache.get("individual_losses")
        sizes = self.cockpit.engine.sizes
        per_sample = []
        if losses is not None and sizes is not None:
            b = sum(sizes)
            per_sample = [losses * (b / (group.world * losses.shape[0]))]
        if sizes is None:
            summed = group.sum(sums)
        else:
            self.results, summed, gathered = _distributed.reduce_results(
                group, self.results, self.transforms, sizes, sums, per_sample, group.held
            )
            if per_sample:
                self.info._cache["individual_losses"] = gathered[0]
        if sums:
            global_loss = summed[0] / group.world
            self.info._given["loss"] = global_loss
            self.info._cache["loss"] = global_loss

    def _compute(self, quantity, data):
        """Run one quantity; in non-strict mode a failure becomes a flagged NaN."""
        try:
            if quantity in self.product_errors:
                raise self.product_errors.pop(quantity)
            result = quantity.compute(self.step, data)
        except Exception as error:
            if self.cockpit.strict:
                raise
            warnings.warn(f"{quantity.name} failed at step {self.step}: {error!r}", stacklevel=3)
            return [Output(float("nan"), flags=[f"{quantity.name}: {type(error).__name__}: {error}"])]
        if result is None:
            return []
        return result if isinstance(result, list) else [result]

    def _check_backward(self, params, served):
        """Raise if the backward pass did not give what the due quantities need (``served``: the
        indices of the parameters whose individual gradients the engine formed in it)."""
        if self.transforms:
            missing = [
                name
                for i, (name, p) in enumerate(zip(self.cockpit.names, params))
                if p.grad is not None and i not in served
                and (self.grads_before[i] is None or not torch.equal(held(p), self.grads_before[i]))
            ]
            if missing:
                raise ValueError(
                    f"step {self.step}: the parameters {', '.join(missing)} got a gradient "
                    "but the engine saw no use of them in the forward pass, so "
                    f"{', '.join(self.needed_by)} cannot be computed. Run the forward pass "
                    "of the model given to the Cockpit, with gradients enabled, before "
                    "entering cp(step)."
                )

    def _cleanup(self):
        """Delete the BackPACK buffers the Cockpit added; detach the user's that carry a graph."""
        for param in self.cockpit.params:
            for field in self.added_savefields:
                if hasattr(param, field):
                    delattr(param, field)
            for field in self.user_savefields:
                value = getattr(param, field, None)
                if torch.is_tensor(value) and value.grad_fn is not None:
                    setattr(param, field, value.detach())


def _scaled_backward(seeds, accumulate, rtol=1e-6):
    """The scale ``σ`` of a step's backward passes relative to ``info["loss"]``, or ``None`` when
    there is none to report: σ = 1 (the loss itself backpropagated), and under accumulation
    σ ≤ 1 as well (``(loss / k).backward()`` with ``info["loss"] = loss`` is how the statistics
    of the effective batch are defined); a larger σ is a loss scale (a ``GradScaler``) that
    the optimizer's gradient does not have. ``seeds``: each pass's σ, on the host."""
    return next((value for value in seeds if value > 1 + rtol or (not accumulate and value < 1 - rtol)), None)


def _gradient_probe(data):
    """A 0-d tensor that is non-finite where a gradient of the step is (NaN and Inf propagate through a
    norm): the largest of the gradient norms where a quantity formed them (``StepData.grad_norms``;
    sharded gradients: their all-reduced norms, so that every rank sees every rank's), else of one
    fused ``_foreach_norm`` pass (in float32 or wider; a quarter of the accurate norms' cost on a small model;
    the probe needs no accuracy)."""
    if "grad_norms" in vars(data) or group_of(data.grads) is not None:
        return torch.stack(data.grad_norms).amax()
    wide = all(g.dtype in (torch.float32, torch.float64) for g in data.grads)  # (float64 cannot be narrowed)
    return torch.stack(torch._foreach_norm(data.grads, 2, dtype=None if wide else torch.float32)).amax()


def _held_gradients(grads):
    """Whether any of ``grads`` (``None`` or tensors) is non-zero (one host sync)."""
    present = [local(g).ne(0).any() for g in grads or () if g is not None]
    return bool(torch.stack(present).any()) if present else False


def _own_passes(group, model, params, whole):
    """``Group.own_passes`` of the ranks; in one process the tracked parameters themselves."""
    return nullcontext(params) if group is None else group.own_passes(model, params, whole)


@contextmanager
def _private_random_state(params, key):
    """Run with the random state of the parameters' devices seeded from ``key``, then restore it.

    BackPACK's Monte-Carlo curvature draws random numbers; this keeps them
    reproducible per step and leaves the user's random streams untouched.
    """
    devices = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})
    seed = hash(key) % 2**63
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed)
        for index in devices:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


def _to_host(tree):
    """Replace every tensor in a nested structure (lists, tuples, dicts) by its host value.

    0-d tensors become Python numbers, larger tensors numpy arrays. The tensors of one
    device and dtype are concatenated and moved in one transfer and cut apart on the
    host, so a step costs a few tensor operations however many values it records.
    """
    found = []

    def collect(node):
        if torch.is_tensor(node):
            found.append(whole(node))  # (sharded over the ranks: gathered)
        elif isinstance(node, (list, tuple)):
            for item in node:
                collect(item)
        elif isinstance(node, dict):
            for item in node.values():
                collect(item)

    collect(tree)
    groups = {}
    for index, tensor in enumerate(found):
        groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    host = [None] * len(found)
    with torch.no_grad():
        for (_, dtype), indices in groups.items():
            scalars = [i for i in indices if not found[i].dim()]  # stacked: a quarter of reshaping each
            arrays = [i for i in indices if found[i].dim()]
            parts = ([torch.stack([found[i] for i in scalars])] if scalars else []) + [found[i].reshape(-1) for i in arrays]
            flat = (parts[0] if len(parts) == 1 else torch.cat(parts)).cpu()
            if dtype == torch.bfloat16:  # numpy has no bfloat16
                flat = flat.float()
            flat = flat.numpy()
            for i, value in zip(scalars, flat[: len(scalars)].tolist()):
                host[i] = value
            offset = len(scalars)
            for i in arrays:
                n = found[i].numel()
                host[i] = flat[offset : offset + n].reshape(found[i].shape)
                offset += n
    values = iter(host)

    def rebuild(node):
        if torch.is_tensor(node):
            return next(values)
        if isinstance(node, list):
            return [rebuild(item) for item in node]
        if isinstance(node, tuple):
            return tuple(rebuild(item) for item in node)
        if isinstance(node, dict):
            return {k: rebuild(v) for k, v in node.items()}
        return node

    return rebuild(tree)
