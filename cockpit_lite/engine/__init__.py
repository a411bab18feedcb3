"""The per-sample engine: exact individual-gradient statistics on any model, without BackPACK.

Definition (the record's, see ``cockpit_lite.log``): sample n's individual gradient is
``g̃_n = B · ∇_θ c_n``, with ``c_n`` sample n's term of the reduced loss and the
derivative taken through the whole graph. ``Σ_n c_n = L``, so ``g = mean_n g̃_n`` on
every model, BatchNorm in training mode included. A sample is one index of the batch
axis; a sequence's token losses are summed.

How a step runs:

1. *Arming.* The engine watches the model's forward pass only when the coming step is
   due (``arm``/``disarm``, decided by the Cockpit at the end of the previous step):
   ``cockpit_lite.engine.capture`` records each call of the modules that own tracked
   parameters (and their ancestors and the BatchNorm layers) and hooks the gradient of
   each call's output. Untracked steps run without any hook.
2. *Planning* (``begin``, when the step's context is entered, after the forward pass,
   before the user's backward): every tracked parameter is routed to the calls that
   used it (a parameter of a module that was never called, like the ``out_proj`` of
   ``nn.MultiheadAttention``, belongs to its nearest called ancestor; a tied parameter
   to every module holding it). Each call gets its layer's rule
   (``cockpit_lite.engine.rules``): fast factored rules for Linear, ConvNd, Embedding
   and the normalisation layers, computed inside the backward pass as soon as the
   call's output gradient arrives, and a ``torch.func`` re-run for every other module,
   computed after the backward pass. Parameters that no rule can serve exactly go to
   the *global path* (``cockpit_lite.engine.global_path``, batched vector-Jacobian
   products of the individual losses, computed right here while the graph exists):
   parameters used before a layer that mixes the samples (BatchNorm in training mode),
   parameters of modules that draw random numbers or call sub-modules of their own,
   and parameters no module owns (given to the Cockpit without a model, used by the
   training loop's own code).

Given parameters without their model (``Cockpit(model.parameters())``, Cockpit's
recipe), the first watched forward pass *discovers* the model (``Engine.discover``):
torch's global module hooks see every module call, and the outermost calls that own
tracked parameters become the model; from then on everything is as if the Cockpit had
been given it.
3. *During backward*: per call, the rule's individual gradients go through the due
   transforms (``cockpit_lite.transforms``) and are dropped. A parameter with several
   uses sums its uses per sample first. At a subsampled step (``cockpit_lite.subsample``)
   a parameter served by one layer's rule keeps its subsample's rows until autograd has
   accumulated its gradient (a hook on the parameter, right after the layer's backward):
   the transforms that read ``g`` use autograd's, so the rule never sums all ``B`` samples
   (for a Linear or a convolution that sum is the work of the layer's weight gradient again).
4. *Finish*: the re-run rules, the sums of multi-use parameters, and a check of every
   parameter served by rules: the rules' gradient ``Σ_n grad_batch[n]`` must equal the
   gradient autograd accumulated in this backward pass (a use the capture did not see,
   e.g. a weight read by a parent's code as well as by its own layer, fails it); at a
   subsampled step a factored weight is checked by a random sketch of that sum, a
   convolution's by a few output channels (``PerSample.check``). A
   failed parameter's values become NaN with a flag and a warning, and it takes the
   global path from the next step on.
5. *Deferred* (under ``torch.distributed``, and for a step of several accumulated backward
   passes): the individual gradients wait in a ``Window`` (``cockpit_lite.engine.window``)
   until the gradient the optimizer steps with is known (DDP's mean of the ranks'; the sum
   of the micro-batches'); then the transforms run on them as chunks of one batch. On a model
   sharded by FSDP2 nothing waits: each parameter's transforms run in its layer's backward
   pass with the global gradient (``cockpit_lite.sharded.ShardedGroup.run``).
"""

import dataclasses
import math
import warnings
import weakref

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from cockpit_lite import transforms as _transforms
from cockpit_lite.engine import broadcast, global_path
from cockpit_lite.engine.capture import Call, ForwardCapture
from cockpit_lite.engine.rules import GENERIC, UnsupportedCall, attention, mixes_samples, rule_for
from cockpit_lite.engine.rules.base import first_tensor
from cockpit_lite.engine.window import Window
from cockpit_lite.info import PENALTY_FIX, penalty_term
from cockpit_lite.utils.shards import local, module_class

GRAD_CHECK_RTOL = {torch.float64: 1e-6, torch.float32: 1e-3}
"""Largest relative difference between the rules' gradient and autograd's before a
parameter is declared served wrongly (low-precision dtypes: ``LOW_PRECISION_RTOL``)."""
LOW_PRECISION_RTOL = 5e-2
NOISE_FACTOR = 10
"""A gradient below the check's floor on which the rules and autograd disagree by more than this many
times the check's tolerance, relative to its own norm, is rounding noise (``Engine.noise``)."""
MODEL_SCALE_FRACTION = 1e-3
"""The check's floor: this fraction of the model's gradient norm, scaled to a parameter's
size, stands in for a parameter's own norm when that is smaller (``Engine._check_gradients``)."""


class Engine:
    """Individual-gradient statistics of the tracked parameters of one model (see the module docstring)."""

    def __init__(self, model, params, names, group=None):
        """
        Args:
            model: the ``torch.nn.Module`` holding ``params``, or ``None`` (then the
                modules that own them are found in the first watched forward pass).
            params, names: the tracked parameters and their names.
            group: the ``cockpit_lite.distributed.Group`` of a DDP run, or ``None``.
        """
        self.model = model
        self.group = group
        self.sizes = None  # every rank's number of samples at the last step (DDP)
        self.pass_grads = {}  # this backward pass's global gradient per parameter (DDP)
        self.params = params
        self.names = names
        self.index = {id(p): i for i, p in enumerate(params)}
        self.force_global = set()
        self.noise = set()  # indices whose gradient was rounding noise in the last finished backward pass
        self._global_mode = global_path.Mode()
        self._warned = set()
        self._step = None
        self._owners, self._parents = {}, {}
        self._owning = weakref.WeakKeyDictionary()
        self._roots = ()  # the modules a ModuleList ``model`` of several found ones holds (``discover``)
        self._graph = None  # the step's loss graph (``prepare``)
        self._sketches = torch.Generator().manual_seed(0)  # the checks' random projections (``PerSample.check``)
        if model is not None:
            self._owners, self._parents, modules = _ownership(model, self.index)
            self.capture = ForwardCapture(modules, self._on_grad)
        else:  # parameters only: find their modules in the first watched forward pass (``discover``)
            self.capture = ForwardCapture(None, self._on_grad, keep=self._keeps)
        self.capture.arm()

    # -- arming -------------------------------------------------------------------------

    def arm(self, on):
        """Watch the next forward pass (``on``) or not."""
        if on:
            self.capture.arm()
        else:
            self.capture.disarm()

    def forget(self):
        """Drop what the capture recorded (the step ends)."""
        self._graph = None
        if self.capture.calls or self.capture._tensor_handles:
            self.capture.clear()

    def replace(self, index, param):
        """Track ``param`` as parameter ``index`` from now on (the model's attribute was reassigned)."""
        self.params[index] = param
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.force_global.discard(index)
        self._owning = weakref.WeakKeyDictionary()
        if self.model is not None:
            self._owners, self._parents, modules = _ownership(self.model, self.index)
            self.capture.watch(modules)

    def prepare(self, loss):
        """Before the step's quantities are asked what they need: the step's own calls.

        Only the watched calls that the step's ``loss`` depends on belong to the step: a
        validation pass with gradients on, or the forward pass of a step whose ``cp(step)``
        was refused, are dropped (the autograd graph is walked only when the model was
        called more than once, or to find the model, ``discover``).
        """
        self._graph = _Graph(loss, self._aliases())
        roots = (self.model, *self._roots)
        forwards = sum(1 for c in self.capture.calls if any(c.module is root for root in roots))
        if (self.model is None or forwards > 1) and self.capture.calls and self._graph.ready():
            reaches = self._graph.reaches
            self.capture.calls = [c for c in self.capture.calls if any(reaches(leaf) for leaf in c.leaves)]
        if self.model is None:
            self.discover()

    def discover(self):
        """Given parameters only: find the modules that own them in the watched forward pass.

        The outermost calls (of the step's, ``prepare``) of modules that own tracked
        parameters are the model: one module, or several called one after the
        other by the training loop (then a ``ModuleList`` of them). From then on the
        engine serves them exactly as if the Cockpit had been given that model (the fast
        layer rules; ``info.model`` for the curvature), the capture watches them with
        per-module hooks, and tracked parameters that none of them owns take the global
        path. Nothing happens once a model is known; when modules ran but none owns a
        tracked parameter (functional code), the engine stops looking (no more global hooks);
        when no module ran while watched, the next watched forward pass tries again.
        """
        if self.model is not None:
            return
        calls = self.capture.calls
        roots = []
        for call in calls:
            if self._owns(call.module) and not any(other.contains(call) for other in calls):
                module = call.module
                if isinstance(module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
                    module = module.module
                if module not in roots:
                    roots.append(module)
        if not roots:
            if self.capture.saw_a_call:  # modules ran, none owns a tracked parameter: stop looking
                self.capture.watch({})
            return
        self.model = roots[0] if len(roots) == 1 else torch.nn.ModuleList(roots)
        self._roots = tuple(roots) if len(roots) > 1 else ()
        self._owners, self._parents, modules = _ownership(self.model, self.index)
        self.capture.watch(modules)
        self.capture.calls = [c for c in self.capture.calls if c.module in modules]
        for call in self.capture.calls:
            call.name = modules[call.module]

    def _owns(self, module):
        """Whether ``module`` holds a tracked parameter somewhere below it (cached)."""
        owns = self._owning.get(module)
        if owns is None:
            owns = any(id(p) in self.index for p in module.parameters())
            self._owning[module] = owns
        return owns

    def _keeps(self, module):
        """Which calls the discovering capture keeps: owners of tracked parameters and
        the layers that mix the samples (their position decides the routes)."""
        return isinstance(module, _BatchNorm) or self._owns(module)

    def input_shape(self):
        """Shape of the model's first input in the observed forward pass, or ``None``."""
        if self.model is None or not self.capture.calls:
            return None
        roots = (self.model, *self._roots)
        for call in sorted(self.capture.calls, key=lambda c: c.start):
            if any(call.module is root for root in roots):
                inputs = first_tensor(list(call.args) + list(call.kwargs.values()))
                return None if inputs is None or inputs.dim() == 0 else tuple(inputs.shape)
        return None

    def batch_size(self):
        """``B`` of the observed forward pass (the model's first input), or ``None``.

        The batch axis is the first one, except for a model with ``batch_first=False``
        (a bare ``nn.LSTM`` or ``nn.Transformer``); other sequence-first models must pass
        ``info["batch_size"]``.
        """
        shape = self.input_shape()
        if shape is None:
            return None
        seq_first = not getattr(self.model, "batch_first", True) and len(shape) > 1
        return shape[1 if seq_first else 0]

    # -- one step -----------------------------------------------------------------------

    def begin(self, transforms, info, batch_size, grads_before, needed_by, window=None, pseudo=None):
        """Plan the step and run the global path (before the user's backward pass).

        Args:
            transforms: the due ``Transform`` objects.
            info: the step's ``StepInfo``.
            batch_size: ``B`` (from ``info`` or the forward pass), or ``None``.
            grads_before: per parameter, the gradient present before this backward
                pass (gradient accumulation) or ``None``.
            needed_by: names of the quantities that need the transforms (for messages).
            window: the ``Window`` of a step whose backward passes are accumulated: this
                pass's individual gradients join it, and ``complete`` runs the transforms
                once the step's last pass is done. ``None``: the transforms run in this
                pass (under DDP once the global gradient is known, after it).
            pseudo: the samples' terms ``[B]`` (with graph) of a pseudo-loss whose backward pass
                comes next instead of the user's (``pseudo_pass``): the global path takes their
                vector-Jacobian products, all samples count, and the calls keep their inputs.
        """
        sharded = self.group is not None and self.group.sharded  # (a pseudo-loss's pass under DDP: this rank's)
        state = _Step(transforms, batch_size, grads_before, needed_by, window,
                      self.group if pseudo is None or sharded else None,
                      None if pseudo is not None else getattr(info, "subset", None))
        state.pseudo = pseudo
        state.penalty = penalty_term(info.get("loss"), parameters_only=True)
        graph = self._graph if self._graph is not None else _Graph(info.get("loss"), self._aliases())
        calls = self.capture.calls if self.model is not None else []
        if calls and graph.ready():  # only the forward passes this loss came from
            calls = [c for c in calls if any(graph.reaches(leaf) for leaf in c.leaves)]
        if self.model is not None and not calls:
            self._warn_once(
                "unobserved",
                "cockpit-lite did not see this step's forward pass (the step number "
                "jumped past the step it was prepared for, or the forward ran under "
                "no_grad): all individual gradients take the exact but slow global "
                "path. Enter cp(step) at every step, with consecutive step numbers.",
            )
        routes = self._routes(calls, state, graph) if calls else {}
        if state.subset is not None and not state.deferred and state.sharded is None:
            self._take_grads_from_autograd(state, routes)
        global_indices = [  # no module owns it (parameters given without their model): global too
            i for i, p in enumerate(self.params)
            if routes.get(i) == "global" or (i not in routes and p.requires_grad and (not calls or i not in self._owners))
        ]
        if state.batch_size is None and (not global_indices or state.sharded is not None):
            raise ValueError(
                "cockpit-lite cannot tell the batch size: pass info['batch_size'] "
                "(the number of samples of the forward pass)"
            )
        if state.sharded is not None and state.batch_size is not None:  # FSDP2: every rank's samples, now
            self.sizes = state.sharded.batch_sizes(state.batch_size)
            if state.subset is not None:
                state.subset = state.sharded.subset_of(state.subset)
            for index in global_indices:  # (cockpit_lite.sharded.GLOBAL_PATH)
                self._fail(state, index, state.sharded.GLOBAL_PATH, demote=False)
            global_indices = []
        if global_indices:  # before any hook of this step exists: its backward passes must not fire them
            try:
                self._run_global(state, info, global_indices)
            except ValueError as error:  # (each sample's loss underivable): refused, unless the engine chose it
                if state.batch_size is None or not set(global_indices) <= self.force_global:
                    raise
                for index in global_indices:
                    self._fail(state, index, (
                        "a layer rule failed for it at an earlier step, so it takes the global path, "
                        f"which cannot run here: {error}"
                    ), demote=False)
        for index, uses in routes.items():
            if uses == "global":
                continue
            state.uses[index] = len(uses)
            for call, name, path in uses:
                if path is not None:  # hooked on a node below the layer (``_pass_inputs``)
                    state.hooked.add(index)
                if path is None:
                    state.calls.setdefault(call, []).append((name, self.params[index], index))
                elif path == "attention":  # projections caught in the graph (rules/attention.py)
                    state.attention.setdefault(call, []).append((name, self.params[index], index))
                elif call is None:  # a shared parameter used outside any layer
                    state.paths.append(broadcast.Path(*path, self._leaf_result(state, index)))
                else:  # a layer whose output every sample shares
                    state.broadcast.setdefault(call, []).append((name, self.params[index], index))
                    if len(state.broadcast[call]) == 1:
                        state.paths.append(broadcast.Path(*path, self._broadcast_result(state, call)))
        served = set(state.calls) | set(state.broadcast) | set(state.attention)
        for call in calls:  # the others' inputs and outputs are not read again: autograd may free them
            if call not in served and state.pseudo is None:
                _release(call)
        for call, tracked in state.attention.items():
            indices = {name: index for name, _, index in tracked}
            state.paths.append(attention.AttentionHooks(
                state.attention_nodes[call], tracked, state.batch_size,
                lambda name, part, low_precision, indices=indices: self._accept(
                    state, indices[name], part, low_precision),
            ))
        self._step = state

    def finish(self):
        """Complete the step after backward: returns ``(results, batch_size, flags)``.

        ``results[index][transform.key]`` holds the values of every parameter that took part.
        """
        state, self._step = self._step, None
        if state is None:
            return {}, None, []
        try:
            with torch.no_grad():
                for call, tracked in state.calls.items():
                    if id(call) not in state.done:
                        self._run_rule(state, call, tracked)
                for index, uses in state.dense.items():
                    if index in state.failed:  # a use failed: the other uses' sum is not its gradient
                        continue
                    parts = uses["parts"] + ([] if uses["sum"] is None else [_transforms.PerSample(
                        self.params[index], index, grad_batch=uses["sum"], batch_size=state.batch_size,
                        grad_before=state.grads_before[index])])
                    part = parts[0] if len(parts) == 1 else _transforms.PerSample(
                        self.params[index], index, parts=parts, batch_size=state.batch_size,
                        grad_before=state.grads_before[index],
                    )
                    if index in state.dense_grads:  # the subsample's rows, the gradient of all samples
                        part.grad = state.dense_grads[index]
                    state.ready(index, part)
                for index in list(state.waiting):  # rules run here, or no gradient reached it (no hook fired)
                    self._on_accumulated(state, index)
                if state.window is not None:  # accumulated: this pass is checked on its own, then kept
                    self._check_gradients(state)
                    state.window.add(state.pending, state.batch_size, state.failed)
                    return state.results, state.batch_size, state.flags
                if state.deferred:  # DDP, one backward pass: the global gradient first
                    window = Window(state.grads_before)
                    window.add(state.pending, state.batch_size, state.failed)
                    self._complete(state, window)
                state.batch.flush()
                self._check_gradients(state)
                if state.sharded is not None:  # the global batch's
                    state.batch_size = sum(self.sizes)
        finally:
            for path in state.paths:
                path.remove()
            self.noise = state.noise
            # the paths' callbacks hold the state: a reference cycle that would keep its tensors (each
            # parameter's served gradient, the dense sums) alive until Python's cycle collector runs
            state.paths, state.served, state.dense, state.pending, state.dense_grads = [], {}, {}, {}, {}
            state.checks, state.waiting, state.resummed = {}, {}, {}
            if state.pseudo is None:
                self.forget()
            else:  # the calls serve the next pass (the user's): only this pass's output gradients go
                for call in self.capture.calls:
                    call.grads = {}
        return state.results, state.batch_size, state.flags

    def pseudo_pass(self, transforms, info, batch_size, outputs, grad_outputs, contributions, needed_by, check=True):
        """The due ``transforms`` of the individual gradients of a pseudo-loss, before the user's backward.

        The pseudo-loss is ``⟨grad_outputs, outputs⟩`` for a tensor ``outputs`` of the step's graph
        (the loss function's input, ``cockpit_lite.curvature.ggn``); ``contributions`` are its
        samples' terms ``[B]``, with graph. Its backward pass (graph retained) runs through the
        same layer rules, broadcast and global paths as the user's. With ``check`` it computes
        autograd's gradient of the pseudo-loss as well and checks the rules' against it; without,
        it asks autograd only for the gradients of the outputs of the layers the rules serve (and
        of the parameters the other paths hook into), which skips their weight gradients: a
        further pass of the same step, whose rules the first pass checked. Nothing of the user's
        step changes: the calls keep their inputs, their output gradients of this pass are
        dropped, ``.grad`` is untouched, and the pass runs under a forked random state.

        Returns:
            ``(results, batch_size, flags)`` as ``finish``.
        """
        self.begin(transforms, info, batch_size, [None] * len(self.params), needed_by, pseudo=contributions)
        state = self._step
        leaves = self._leaves()
        trainable = [i for i, p in enumerate(self.params) if p.requires_grad]
        inputs = [leaves[i] for i in trainable] if check else _pass_inputs(state, leaves)
        try:
            if inputs:
                with global_path.forked_random_state(self.params), torch.enable_grad():
                    grads = torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True)
        except BaseException:
            for path in state.paths:
                path.remove()
            self._step = None
            for call in self.capture.calls:
                call.grads = {}
            raise
        state.true_grads = {
            i: torch.zeros_like(leaves[i]) if g is None else g.detach() for i, g in zip(trainable, grads)
        } if check else {}
        if state.sharded is not None:  # (FSDP2: this rank's rows of their mean over the ranks, as the rules')
            state.true_grads = {i: state.sharded.reduce_scatter([g / state.sharded.world], self.params[i])[0]
                                for i, g in state.true_grads.items()}
        return self.finish()

    # -- internals ----------------------------------------------------------------------

    def _routes(self, calls, state, graph):
        """``{index: [(call, name in the module, broadcast path), ...] | "global"}`` for the
        parameters that took part (path ``None``: the call's rule on its own output gradient)."""
        by_module = {}
        for call in calls:
            by_module.setdefault(call.module, []).append(call)
        mixing = [c for c in calls if mixes_samples(c.module)]
        routes = {}
        for index, param in enumerate(self.params):
            if not param.requires_grad:  # frozen since: no individual gradients (zeros in the statistics)
                continue
            if index in self.force_global:
                routes[index] = "global"
                continue
            uses = []
            for module, name in self._owners.get(index, ()):
                while module not in by_module and module in self._parents:
                    module, child = self._parents[module]
                    name = f"{child}.{name}"
                uses += [(call, name) for call in by_module.get(module, ())]
            if not uses:
                continue
            routed = []
            for call, name in uses:
                route = self._route(call, name, param, calls, mixing, state, graph)
                if route is None:
                    break
                routed.append(route)
            routes[index] = routed if len(routed) == len(uses) else "global"
        return routes

    def _route(self, call, name, param, calls, mixing, state, graph):
        """How one use of a parameter is served: ``(call, name, path)``, or ``None`` (global)."""
        if any(call.end < m.start or call.contains(m) for m in mixing if m is not call):
            return None  # a later layer mixes the samples: δ_n is not ∂c_n/∂output
        if state.batch_size is None:
            return None
        if module_class(call.module) is torch.nn.MultiheadAttention and graph.ready():
            if call not in state.attention_nodes:
                state.attention_nodes[call] = attention.plan(
                    graph._users, graph._accumulators, call.module, state.batch_size
                )
            if state.attention_nodes[call] is not None:
                return (call, name, "attention")
        rule = GENERIC if "." in name else rule_for(call.module)
        if rule is GENERIC and any(call.contains(c) for c in calls):
            if "." in name or mixing:  # own code around sub-module calls: only a shared parameter it uses
                return None
            path = graph.path_from_parameter(param, state.batch_size)
            return None if path is None else (None, name, path)
        shared = call.leaves and all(_no_batch_axis(leaf, state.batch_size) for leaf in call.leaves)
        if not shared and len(call.leaves) == 1 and graph.ready():  # a shared tensor of length B?
            shared = graph.broadcast_into_batch(call.leaves[0], state.batch_size)
        if shared:
            if len(call.leaves) != 1:
                return None
            try:
                rule.check(_as_if_batched(call, state.batch_size), state.batch_size)
            except UnsupportedCall:
                return None
            path = graph.path_from_tensor(call.leaves[0], state.batch_size)
            return None if path is None else (call, name, path)
        try:
            rule.check(call, state.batch_size)
        except UnsupportedCall:
            return None
        return (call, name, None)

    def _leaf_result(self, state, index):
        def done(grad_batch):
            self._accept(state, index, _transforms.PerSample(self.params[index], index, grad_batch=grad_batch))

        return done

    def _broadcast_result(self, state, call):
        def done(delta):
            self._run_rule(state, _as_if_batched(call, state.batch_size, delta), state.broadcast[call])

        return done

    def _on_grad(self, call, position, grad):
        state = self._step
        if state is None or grad is None:  # (BackPACK's wrapped outputs may pass None)
            return
        if grad.dtype in (torch.float16, torch.bfloat16):
            state.low_precision = True
        tracked = state.calls.get(call)
        if tracked is None:  # no rule reads it: not kept (the logits' δ is large)
            return
        if id(call) in state.done:  # an output's hook fires once per backward pass: this is another
            state.repeated = True
            return
        call.grads[position] = grad
        if len(call.grads) < len(call.leaves):
            return
        rule = rule_for(call.module)
        if rule is not GENERIC and all("." not in name for name, _, _ in tracked):
            with torch.no_grad():
                self._run_rule(state, call, tracked)

    def _run_rule(self, state, call, tracked):
        state.done.add(id(call))
        rule = rule_for(call.module) if all("." not in name for name, _, _ in tracked) else GENERIC
        if not call.leaves:
            return
        self.capture.paused = True
        try:
            if state.subset is not None and all(state.uses.get(index, 1) == 1 for _, _, index in tracked):
                per_sample = rule.per_sample_of(call, tracked, state.batch_size, state.subset)
            else:  # (a parameter with several uses sums all samples' individual gradients first)
                per_sample = rule.per_sample(call, tracked, state.batch_size)
        except Exception as error:  # a rule that fails inside the user's backward pass: NaN and a flag, never a crash
            for _, _, index in tracked:
                self._fail(state, index, f"{call.name or type(call.module).__name__}: {type(error).__name__}: {error}")
            return
        finally:
            self.capture.paused = False
            if state.pseudo is None:  # read: the factors hold what they need of it
                _release(call)
        for name, param, index in tracked:
            part = per_sample.pop(name)  # dropped as soon as its transforms ran
            self._accept(state, index, part)
            del part

    def _take_grads_from_autograd(self, state, routes):
        """At a subsampled step: the parameters whose transforms take ``g`` from autograd (every use
        served by a layer's rule, in float32 or wider), each with a hook that fires once autograd has
        accumulated its gradient. A parameter with several uses gets a seed of its own, with which
        every use draws the same sketch (``PerSample.sketch``: the uses' sketches add up)."""
        state.generator = self._sketches
        for index, uses in routes.items():
            param = self.params[index]
            if uses == "global" or any(path not in (None, "attention") for _, _, path in uses):
                continue
            if param.dtype not in GRAD_CHECK_RTOL or not param.requires_grad:
                continue
            state.from_autograd.add(index)
            if len(uses) > 1:
                state.seeds[index] = int(torch.randint(2**62, (), generator=self._sketches))
            state.paths.append(param.register_post_accumulate_grad_hook(
                lambda param, index=index: self._on_accumulated(state, index)))

    def _on_accumulated(self, state, index):
        """Parameter ``index``'s gradient of this backward pass is in ``.grad``: the transforms
        that read ``g`` run on the subsample's rows kept for them (``_Step.ready``)."""
        waiting = state.waiting.pop(index, None)
        if waiting is None:
            return
        part, results = waiting
        param = self.params[index]
        try:
            with torch.no_grad():
                grad = param.grad.detach() if param.grad is not None else torch.zeros_like(param)
                if state.grads_before[index] is not None:
                    grad = grad - state.grads_before[index]
                part.grad = grad.reshape(-1)
                results.update(_transforms.run([t for t in state.transforms if t.reads_grad], part, state.batch,
                                               state.scratch))
        except Exception as error:  # never a crash of the user's backward pass
            self._fail(state, index, f"{type(error).__name__}: {error}")

    def _accept(self, state, index, part, low_precision=False):
        """One use's individual gradients of parameter ``index``."""
        if low_precision:
            state.low_precision = True
        if part.num_samples not in (state.batch_size, state.held):
            self._fail(state, index, f"a layer rule gave {part.num_samples} individual gradients for a batch of {state.batch_size}")
            return
        part.batch_size = state.batch_size
        part.grad_before = state.grads_before[index]
        if state.uses.get(index, 1) > 1:  # the uses are summed once all have arrived (``finish``)
            if state.subset is not None and part.num_samples == state.batch_size:  # subsampled: k rows
                rows = state.subset.to(part.param.device)
                if state.takes_autograd_grad(index):  # this use's part of the sketch that checks the sum
                    value, project = part.sketch(torch.Generator().manual_seed(state.seeds[index]))
                    if index in state.checks:
                        value = value + state.checks[index][0]
                    state.checks[index] = (value, project)
                    part = part.select(rows, with_grad=False)  # the sum of the uses gets autograd's
                else:
                    grad = part.grad  # this use's gradient of all B samples
                    state.dense_grads[index] = grad if index not in state.dense_grads else state.dense_grads[index] + grad
                    part = part.select(rows)
            uses = state.dense.setdefault(index, {"parts": [], "sum": None})
            if part.held_elements() < part.num_samples * part.param.numel():
                uses["parts"].append(part)  # factors or rows: smaller than [K, *shape] (a tied head's)
            elif uses["sum"] is None:  # the others summed in place: one [K, *shape] tensor for all
                uses["sum"] = part.owned_grad_batch()
            else:
                part.add_to(uses["sum"])
        else:
            state.ready(index, part)

    def _run_global(self, state, info, indices):
        contributions = state.pseudo if state.pseudo is not None else info.contributions(", ".join(state.needed_by))
        if state.batch_size is None:
            state.batch_size = contributions.shape[0]
        elif contributions.shape[0] != state.batch_size:
            raise ValueError(
                f"the loss has {contributions.shape[0]} samples but the forward pass had "
                f"{state.batch_size}; pass info['batch_size']"
            )
        params = [self.params[i] for i in indices]
        with global_path.forked_random_state(params), torch.enable_grad():  # a recomputed segment's draws
            totals = torch.autograd.grad(contributions.sum(), params, retain_graph=True, allow_unused=True)
        if any(g is None for g in totals) and global_path.reentrant_checkpoint(contributions):
            hidden = [self.names[i] for i, g in zip(indices, totals) if g is None]
            raise ValueError(
                f"the loss runs through torch.utils.checkpoint(..., use_reentrant=True), whose segment hides the "
                f"parameters inside it ({', '.join(hidden[:5])}{', ...' if len(hidden) > 5 else ''}) from every "
                "backward pass but the user's own, so their individual gradients cannot be formed. Fix: "
                "checkpoint with use_reentrant=False (PyTorch's recommended mode; same memory savings)"
            )
        totals = [torch.zeros_like(p) if g is None else g.detach() for g, p in zip(totals, params)]
        parts = {i: [] for i in indices}
        if state.subset is not None:  # the subsample's vector-Jacobian products only
            contributions = contributions[state.subset.to(contributions.device)]
        for samples, grads in global_path.individual_gradients(contributions, params, self._global_mode):
            with torch.no_grad():
                for index, grad_batch, total in zip(indices, grads, totals):
                    if state.subset is None:  # a second sum of the same gradient (``_check_gradients``: noise)
                        part = grad_batch.sum(0).reshape(-1)
                        state.resummed[index] = part if index not in state.resummed else state.resummed[index] + part
                    per_sample = _transforms.PerSample(
                        self.params[index], index, grad_batch=grad_batch, batch_size=state.batch_size,
                        grad_before=state.grads_before[index],
                    )
                    per_sample.grad = total.reshape(-1)
                    parts[index].append(grad_batch if state.deferred else _transforms.run(state.transforms, per_sample))
        for (index, chunks), total in zip(parts.items(), totals):
            if state.deferred:  # the transforms wait for the step's gradient (DDP, accumulation)
                grad_batch = torch.cat([chunk for chunk in chunks])
                state.ready(index, _transforms.PerSample(
                    self.params[index], index, grad_batch=grad_batch, batch_size=state.batch_size,
                    grad_before=state.grads_before[index],
                ))
                if not state.distributed:  # checked: was info["loss"] what ran backward?
                    state.served[index] = total.reshape(-1)
                    state.global_path.add(index)
                continue
            state.results[index] = {
                t.key: t.combine([chunk[t.key] for chunk in chunks]) for t in state.transforms
            }
            state.served[index] = total.reshape(-1)  # checked too: was info["loss"] what ran backward?
            state.global_path.add(index)

    def _complete(self, state, window):
        """DDP, one backward pass: its window's results (``Window.complete``), checked against autograd."""
        results, state.batch_size, grads, self.sizes = window.complete(self.params, state.transforms, self.group)
        state.results.update(results)
        self.pass_grads = grads
        for index, grad in grads.items():
            state.served[index] = None if state.grads_before[index] is not None else grad
        _nan_where_failed(state.results, window.failed)

    def complete(self, window, transforms, grads_after):
        """The results of an accumulated step, after its last backward pass.

        Returns:
            ``(results, batch_size)`` of the effective batch (``cockpit_lite.engine.window``).
        """
        with torch.no_grad():
            results, batch_size, grads, sizes = window.complete(self.params, transforms, self.group, grads_after)
        if self.group is not None:
            self.sizes, self.pass_grads = sizes, grads
        _nan_where_failed(results, window.failed)
        return results, batch_size

    def _check_gradients(self, state):
        """Each rule-served parameter's ``Σ_n grad_batch[n]`` against autograd's gradient (at a
        subsampled step, ``PerSample.check``'s estimate of their difference where it has one).

        The tolerance is relative to the larger of the parameter's own gradient norm and
        ``MODEL_SCALE_FRACTION`` of the model's gradient norm scaled to the parameter's
        size (``‖g_model‖ · sqrt(numel / model numel)``): a gradient that is zero in exact
        arithmetic (attention key biases, which softmax ignores) is rounding noise in both,
        and two noises must not fail the check against each other.
        """
        checked = []
        served = [(index, (grad, None)) for index, grad in state.served.items()] + list(state.checks.items())
        for index, (engine, project) in served:
            if engine is None or index in state.failed:
                continue
            param = self.params[index]
            if state.true_grads is not None:  # a pseudo-loss's pass (``pseudo_pass``): autograd's of it
                true = state.true_grads.get(index)
            elif param.grad is None:
                continue
            else:
                true = local(param.grad.detach())  # (FSDP2: this rank's rows, as ``engine``)
                if state.grads_before[index] is not None:
                    true = true - local(state.grads_before[index])
            if true is None:
                continue
            true = true.to(engine.dtype)
            checked.append((index, param, engine, true, true.reshape(-1) if project is None else project(true)))
        if not checked:
            return
        # every parameter's norms in two fused operations (one host transfer each)
        norms = torch._foreach_norm([true for _, _, _, true, _ in checked])
        errors = torch._foreach_norm(torch._foreach_sub([e for _, _, e, _, _ in checked], [c for *_, c in checked]))
        norms, errors = ([float(n) for n in values] for values in (norms, errors))
        if state.sharded is not None:
            norms, errors = state.sharded.check_norms(norms, errors)
        size = sum(param.numel() for _, param, _, _, _ in checked)
        model = sum(n * n for n in norms if math.isfinite(n)) ** 0.5
        for (index, param, engine, true, compared), norm, error in zip(checked, norms, errors):
            low = param.dtype not in GRAD_CHECK_RTOL or engine.dtype not in GRAD_CHECK_RTOL or state.low_precision
            rtol = LOW_PRECISION_RTOL if low else GRAD_CHECK_RTOL[param.dtype]
            scale = max(norm, MODEL_SCALE_FRACTION * model * (param.numel() / size) ** 0.5)
            disagreement = error
            resummed = state.resummed.get(index)  # (the global path's: its VJPs' sum against their total's)
            if resummed is not None and norm < scale:
                disagreement = max(error, float((resummed.to(engine.dtype) - engine).norm()))
            if norm < scale and disagreement > NOISE_FACTOR * rtol * norm:  # zero up to rounding: noises disagree
                state.noise.add(index)
            if error > rtol * scale + 1e-30 and torch.isfinite(true).all():
                away = f"{error / max(norm, 1e-30):.2g} (relative) away from autograd's"
                if state.repeated:  # not a use the engine missed, nor (only) another loss
                    self._fail(state, index, (
                        f"the individual gradients sum to a gradient {away}: backward ran more than once "
                        "inside cp(step), and they are those of one backward pass. Fix: call "
                        "backward once, on the sum of the losses ((loss_a + loss_b).backward()), and pass "
                        "that sum as info['loss'] (micro-batches: Cockpit(model, accumulate=True) and one "
                        "`with cp(step)` around each backward)"
                    ), demote=False)
                    continue
                if state.penalty is not None and index not in state.global_path:
                    reason = f"the individual gradients sum to a gradient {away}: {state.penalty}"
                elif index in state.global_path:
                    reason = (
                        f"the gradient of info['loss'] is {away} in this backward pass: backward ran on "
                        "another loss (e.g. info['loss'] plus a penalty on the parameters, such as an "
                        "explicit L2 term). Fix: call backward on info['loss'] inside the context; for "
                        f"a penalty, {PENALTY_FIX}"
                    )
                else:
                    reason = (
                        f"the individual gradients sum to a gradient {away}: the parameter is used "
                        "somewhere the engine did not see (e.g. read by a parent module's own code as "
                        "well), or backward ran on another loss than info['loss'] (e.g. info['loss'] "
                        f"plus a penalty on the parameters, such as an explicit L2 term: {PENALTY_FIX})"
                    )
                self._fail(state, index, reason)

    def _fail(self, state, index, reason, demote=True):
        """Mark a parameter's values of this step NaN; it takes the global path from now on
        (``demote``; not if the global path would not change the reason)."""
        state.failed.add(index)
        if demote:
            self.force_global.add(index)
        name = self.names[index]
        state.flags.append(f"individual gradients of {name} unavailable at this step: {reason}")
        if index in state.global_path:
            self._warn_once(("loss", index), (
                f"cockpit-lite: the individual gradients of {name} are not those of the backward "
                f"pass ({reason}); its values are NaN at every step where this holds."
            ))
        elif not demote:
            self._warn_once(("unavailable", index), (
                f"cockpit-lite: individual gradients of {name} unavailable ({reason}); its values are "
                "NaN at every step where this holds."
            ))
        else:
            self._warn_once(
                ("failed", index),
                f"cockpit-lite: individual gradients of {name} could not be formed by a layer rule "
                f"({reason}); this step's values involving it are NaN, and from the next step on it "
                "takes the exact global path (slower).",
            )
        if index not in state.results:  # values of the right shapes, from zeros
            param = self.params[index]
            zeros = torch.zeros((state.held or 1, *param.shape), dtype=param.dtype, device=param.device)
            zeros = _transforms.PerSample(param, index, grad_batch=zeros, batch_size=state.batch_size)
            state.results[index] = (_transforms.run(state.transforms, zeros) if state.sharded is None
                                    else state.sharded.run(state.transforms, zeros)[0])
        state.results[index] = {k: _nan_like(v) for k, v in state.results[index].items()}

    def _leaves(self):
        """The tensors of the step's graph that stand for the tracked parameters (FSDP2: its unsharded ones)."""
        return self.params if self.group is None else self.group.leaves(self.model, self.params)

    def _aliases(self):
        """FSDP2: the unsharded parameters in the graph and the tracked ones they stand for."""
        return self.group.unsharded(self.model) if self.group is not None and self.model is not None else None

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=4)


class _Step:
    """What one step's engine collects."""

    def __init__(self, transforms, batch_size, grads_before, needed_by, window=None, group=None, subset=None):
        self.window = window
        self.subset = subset  # the sample indices of a subsampled step (``cockpit_lite.subsample``), or None
        self.sharded = group if group is not None and group.sharded else None  # FSDP2 (``cockpit_lite.sharded``)
        self.distributed = group is not None and self.sharded is None  # DDP
        self.deferred = window is not None or self.distributed  # the transforms run once the step's gradient is known
        self.pending = {}
        self.transforms = tuple(transforms)
        self.batch_size = batch_size
        self.grads_before = grads_before
        self.needed_by = tuple(needed_by)
        self.calls = {}  # call -> [(name, param, index)]
        self.broadcast = {}  # call whose output all samples share -> [(name, param, index)]
        self.attention = {}  # MultiheadAttention call served from its projections -> [(name, param, index)]
        self.attention_nodes = {}
        self.paths = []
        self.uses = {}
        self.done = set()
        self.dense = {}  # a parameter with several uses: {"parts": uses in their own form, "sum": the others'}
        self.dense_grads = {}  # subsampled: per multi-use parameter, the sum of its uses' gradients of all B
        self.results = {}
        self.served = {}  # index -> the gradient the engine's individual gradients sum to (None: not checked)
        self.global_path = set()  # indices served by the global path
        self.failed = set()
        self.flags = []
        self.low_precision = False
        self.repeated = False  # a served layer's output received a second gradient: backward ran again
        self.batch = _transforms.Batch()
        self.scratch = _transforms.Scratch()  # the memory the chunks of built individual gradients are formed in
        self.from_autograd = set()  # subsampled: parameters whose transforms take ``g`` from autograd
        self.waiting = {}  # index -> (the subsample's PerSample, its results) until autograd's ``g`` is known
        self.checks = {}  # index -> ``PerSample.check``'s (value, project), checked in ``_check_gradients``
        self.generator = None
        self.seeds = {}  # subsampled: per parameter of several uses, the seed of their common sketch
        self.hooked = set()  # indices of parameters served by hooks on graph nodes (attention, shared tensors)
        self.pseudo = None  # a pseudo-loss's samples' terms (``Engine.pseudo_pass``), or None: the user's pass
        self.noise = set()  # indices whose gradient is zero up to rounding (``Engine._check_gradients``)
        self.resummed = {}  # global path: index -> the sum of its individual gradients, beside their total
        self.true_grads = None  # a pseudo-loss pass: autograd's gradient of it per parameter index

    def takes_autograd_grad(self, index):
        """Whether parameter ``index``'s transforms take ``g`` from autograd at this step (a low-precision
        backward pass keeps the rules' sum, unless a use has already been sketched)."""
        return index in self.from_autograd and (index in self.checks or not self.low_precision)

    @property
    def held(self):
        """The number of samples whose individual gradients the transforms see (``k`` or ``B``)."""
        return len(self.subset) if self.subset is not None else self.batch_size

    def ready(self, index, per_sample):
        """Run the transforms on a parameter's complete individual gradients (later, if deferred).

        A subsampled step's transforms see the subsample's rows only, with the gradient of all
        ``B`` samples: autograd's for a parameter in ``from_autograd`` (the transforms that read
        it wait for it in ``waiting``, until ``Engine._on_accumulated``; the check against
        autograd is ``PerSample.check``, prepared here from all samples), else the sum of the
        individual gradients (which the check reads)."""
        if self.subset is not None and per_sample.num_samples == self.batch_size:
            per_sample = per_sample.select(self.subset.to(per_sample.param.device))
        if self.takes_autograd_grad(index):
            if index not in self.checks:  # (one of several uses: their sketches, from ``Engine._accept``)
                self.checks[index] = per_sample.check(self.generator)
            now = [t for t in self.transforms if not t.reads_grad]
            self.results[index] = _transforms.run(now, per_sample, self.batch, self.scratch)
            if len(now) < len(self.transforms):
                self.waiting[index] = (per_sample, self.results[index])
            return
        if self.deferred:
            self.pending[index] = per_sample
            if not self.distributed:  # each accumulated pass is checked on its own
                self.served[index] = per_sample.grad
            return
        self.results[index], self.served[index] = self.run(per_sample)

    def run(self, per_sample):
        """``(results, gradient to check)`` of the transforms on one parameter's individual gradients,
        at once (FSDP2: ``ShardedGroup.run``, this rank's rows of the gradient)."""
        if self.sharded is not None:
            return self.sharded.run(self.transforms, per_sample, self.batch, self.scratch)
        return _transforms.run(self.transforms, per_sample, self.batch, self.scratch), per_sample.grad


class _Graph:
    """The autograd graph of the step's loss, walked once, on demand (``cockpit_lite.engine.broadcast``)."""

    def __init__(self, loss, aliases=None):
        self._loss = loss
        self._users = None
        self._aliases = aliases or {}  # id(a leaf of the graph) -> the tracked parameter it stands for (FSDP2)

    def ready(self):
        """Whether the loss has a graph (walked on the first call)."""
        if self._users is None:
            self._root = getattr(self._loss, "grad_fn", None)
            self._users = broadcast.consumers(self._root) if self._root is not None else {}
            self._accumulators = broadcast.accumulators(self._users)
            for leaf, param in self._aliases.items():
                if leaf in self._accumulators:
                    self._accumulators[id(param)] = self._accumulators[leaf]
        return self._root is not None

    def reaches(self, tensor):
        """Whether the loss depends on ``tensor``."""
        return tensor.grad_fn is self._root or (tensor.grad_fn, tensor.output_nr) in self._users

    def path_from_parameter(self, param, batch_size):
        if not self.ready() or id(param) not in self._accumulators:
            return None
        found = broadcast.plan(self._users, (self._accumulators[id(param)], 0), param.shape, batch_size)
        return None if found is None else (found, param.shape, batch_size)

    def broadcast_into_batch(self, tensor, batch_size):
        if tensor.grad_fn is None:
            return False
        return broadcast.broadcast_into_batch(self._users, (tensor.grad_fn, tensor.output_nr), tensor.shape, batch_size)

    def path_from_tensor(self, tensor, batch_size):
        if not self.ready() or tensor.grad_fn is None:
            return None
        found = broadcast.plan(self._users, (tensor.grad_fn, tensor.output_nr), tensor.shape, batch_size)
        return None if found is None else (found, tensor.shape, batch_size)


def _pass_inputs(state, params):
    """What a backward pass must reach for the hooks of ``state`` to fire: the output tensors (as
    gradient edges) of the calls whose rules read their output gradients, and the parameters of the
    other hooked paths (attention projections, shared tensors), whose hooks sit on nodes below."""
    from torch.autograd.graph import GradientEdge

    edges = [GradientEdge(leaf.grad_fn, leaf.output_nr) for call in state.calls for leaf in call.leaves
             if leaf.grad_fn is not None]
    return edges + [params[index] for index in sorted(state.hooked)]


def _no_batch_axis(tensor, batch_size):
    return batch_size > 1 and batch_size not in tuple(tensor.shape)


def _as_if_batched(call, batch_size, delta=None):
    """A call whose output all samples share, as if every sample had made it: its inputs and
    output gain a leading batch axis, and ``delta`` (``[B, *output shape]``, the samples'
    output gradients) is its output gradient."""
    shared = call.leaves[0]
    virtual = Call(
        call.module, call.name,
        tuple(_expand(a, batch_size) for a in call.args),
        {k: _expand(v, batch_size) for k, v in call.kwargs.items()},
        call.start, call.end,
    )
    virtual.leaves = [dataclasses.replace(shared, grad_fn=None, shape=torch.Size((batch_size, *shared.shape)))]
    virtual.leaf_positions = [0]
    if delta is not None:
        virtual.grads = {0: delta}
    return virtual


def _release(call):
    """Drop a call's references to its inputs and output gradients (activations that autograd
    frees during the backward pass would otherwise live until the step ends)."""
    call.args, call.kwargs, call.grads, call.leaves = (), {}, {}, []


def _expand(value, batch_size):
    if torch.is_tensor(value):
        return value.expand(batch_size, *value.shape)
    return value


def _nan_where_failed(results, failed):
    """A parameter one of whose uses failed in some backward pass: all its values NaN (never the sum of the rest)."""
    for index in failed & results.keys():
        results[index] = {k: _nan_like(v) for k, v in results[index].items()}


def _nan_like(value):
    if torch.is_tensor(value):
        return torch.full_like(value, float("nan"), dtype=value.dtype if value.is_floating_point() else torch.float64)
    if isinstance(value, tuple):
        return tuple(_nan_like(v) for v in value)
    return value


def _ownership(model, index):
    """``(owners, parents, modules)``.

    ``owners[i]``: the ``(module, attribute name)`` pairs holding tracked parameter ``i``
    (several for a tied parameter); ``parents[module] = (parent, name in parent)``;
    ``modules``: ``{module: name}`` to watch (owners, their ancestors and BatchNorm layers).
    """
    owners, parents, names = {}, {}, {}
    for name, module in model.named_modules():  # a module registered twice (ModuleList([block] * n)) once
        names.setdefault(module, name)
        for child_name, child in module.named_children():
            parents.setdefault(child, (module, child_name))
        for attribute, param in module._parameters.items():
            if param is not None and id(param) in index:
                owners.setdefault(index[id(param)], []).append((module, attribute))
    watched = {model}
    for pairs in owners.values():
        for module, _ in pairs:
            while module is not None and module not in watched:
                watched.add(module)
                module = parents.get(module, (None, None))[0]
    watched |= {m for m in names if isinstance(m, _BatchNorm)}
    return owners, parents, {m: names[m] for m in names if m in watched}

