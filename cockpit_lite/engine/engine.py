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
   training loop's own code). When the plan is new, a probe
   (``cockpit_lite.engine.independence``) checks that no code after a layer mixes the
   samples (a contrastive loss, batch statistics in ``forward``); the layers it finds
   take the global path too.

Given parameters without their model (``Cockpit(model.parameters())``, Cockpit's
recipe), the first watched forward pass *discovers* the model (``Engine.discover``):
torch's global module hooks see every module call, and the outermost calls that own
tracked parameters become the model; from then on everything is as if the Cockpit had
been given it.
3. *During backward*: per call, the rule's individual gradients go through the due
   transforms (``cockpit_lite.engine.transforms``) and are dropped. A parameter with several
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

import warnings
import weakref

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from cockpit_lite.engine import transforms as _transforms
from cockpit_lite.engine.per_sample import PerSample
from cockpit_lite.engine import broadcast, global_path
from cockpit_lite.engine.independence import Probe
from cockpit_lite.engine.capture import ForwardCapture, ownership
from cockpit_lite.engine.check import GRAD_CHECK_RTOL, check_gradients
from cockpit_lite.engine.routes import route_use
from cockpit_lite.engine.rules import GENERIC, attention, mixes_samples, rule_for
from cockpit_lite.engine.rules.base import first_tensor
from cockpit_lite.engine.step import Graph, Step, as_if_batched, nan_like, nan_where_failed, pass_inputs, release
from cockpit_lite.engine.window import Window
from cockpit_lite.info import penalty_term
from cockpit_lite.utils.grads import dense, held
from cockpit_lite.utils.shards import is_sharded


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
        self._global_reasons = {}  # index -> why the engine sent it to the global path (other than a failed rule)
        self.noise = set()  # indices whose gradient was rounding noise in the last finished backward pass
        self._global_mode = global_path.Mode()
        self._probe = Probe()
        self._warned = set()
        self._step = None
        self._owners, self._parents = {}, {}
        self._owning = weakref.WeakKeyDictionary()
        self._roots = ()  # the modules a ModuleList ``model`` of several found ones holds (``discover``)
        self._graph = None  # the step's loss graph (``prepare``)
        self._sketches = torch.Generator().manual_seed(0)  # the checks' random projections (``PerSample.check``)
        if model is not None:
            self._owners, self._parents, modules = ownership(model, self.index)
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
        self._global_reasons.pop(index, None)
        self._owning = weakref.WeakKeyDictionary()
        if self.model is not None:
            self._owners, self._parents, modules = ownership(self.model, self.index)
            self.capture.watch(modules)

    def prepare(self, loss):
        """Before the step's quantities are asked what they need: the step's own calls.

        Only the watched calls that the step's ``loss`` depends on belong to the step: a
        validation pass with gradients on, or the forward pass of a step whose ``cp(step)``
        was refused, are dropped (the autograd graph is walked only when the model was
        called more than once, or to find the model, ``discover``).
        """
        self._graph = Graph(loss, self._aliases())
        if self.model is not None and self.capture.calls:  # a model that never runs itself (a ModuleDict, the
            called = any(c.module is self.model for c in self.capture.calls)  # ModuleList of the parts found):
            self._roots = () if called else tuple(self._outermost())  # its outermost called parts stand for it
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
        roots = self._outermost()
        if not roots:
            if self.capture.saw_a_call:  # modules ran, none owns a tracked parameter: stop looking
                self.capture.watch({})
            return
        self.model = roots[0] if len(roots) == 1 else torch.nn.ModuleList(roots)
        self._roots = tuple(roots) if len(roots) > 1 else ()
        self._owners, self._parents, modules = ownership(self.model, self.index)
        self.capture.watch(modules)
        self.capture.calls = [c for c in self.capture.calls if c.module in modules]
        for call in self.capture.calls:
            call.name = modules[call.module]

    def _outermost(self):
        """The modules of the outermost watched calls that own tracked parameters, in call order."""
        roots, end = [], None
        for call in sorted(self.capture.calls, key=lambda c: c.start):  # (calls nest: one sweep finds the outermost)
            if end is not None and call.end < end:
                continue
            end = call.end
            if self._owns(call.module):
                module = call.module
                if isinstance(module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
                    module = module.module
                if module not in roots:
                    roots.append(module)
        return roots

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
        (a bare ``nn.LSTM`` or ``nn.Transformer``) or one whose first recurrent layer or
        attention, sequence-first, takes a tensor that begins as the model's input does
        (``[T, B]`` token ids embedded to ``[T, B, E]``, PyTorch's word language model);
        other sequence-first models must pass ``info["batch_size"]``.
        """
        shape = self.input_shape()
        if shape is None:
            return None
        seq_first = len(shape) > 1 and (not getattr(self.model, "batch_first", True) or self._sequence_first(shape))
        return shape[1 if seq_first else 0]

    def _sequence_first(self, shape):
        """Whether the first recurrent layer or attention called (a transformer's first self-attention
        takes the transformer's input) is sequence-first and takes an input that begins with the model
        input's first two sizes (``[T, B, ...]``)."""
        layers = (torch.nn.RNNBase, torch.nn.Transformer, torch.nn.MultiheadAttention)
        for call in sorted(self.capture.calls, key=lambda c: c.start):
            if isinstance(call.module, layers) and call.module is not self.model:
                inputs = first_tensor(list(call.args) + list(call.kwargs.values()))
                return (not call.module.batch_first and inputs is not None and inputs.dim() > 2
                        and tuple(inputs.shape[:2]) == tuple(shape[:2]))
        return False

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
        state = Step(transforms, batch_size, grads_before, needed_by, window,
                      self.group if pseudo is None or sharded else None,
                      None if pseudo is not None else getattr(info, "subset", None))
        state.pseudo = pseudo
        state.penalty = penalty_term(info.get("loss"), parameters_only=True)
        graph = self._graph if self._graph is not None else Graph(info.get("loss"), self._aliases())
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
        state.unreached = self._unreached(state, graph, info)
        routes = self._routes(calls, state, graph) if calls else {}
        self.capture.snapshot.update(state.replays)
        if self._mixed(routes, info, needed_by, state, calls):
            routes = self._routes(calls, state, graph)
        if state.subset is not None and not state.deferred and state.sharded is None:
            self._take_grads_from_autograd(state, routes)
        global_indices = [  # no module owns it (parameters given without their model): global too
            i for i, p in enumerate(self.params)
            if routes.get(i) == "global" or (i not in routes and p.requires_grad and i not in state.unreached
                                             and (not calls or i not in self._owners))
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
        self._note_global(state, global_indices)
        if global_indices:  # before any hook of this step exists: its backward passes must not fire them
            try:
                global_path.serve(state, info, global_indices, self.params, self.names, self._global_mode)
            except ValueError as error:  # (each sample's loss underivable): refused, unless the engine chose it
                if state.batch_size is None or not set(global_indices) <= self.force_global:
                    raise
                for index in global_indices:
                    why = self._global_reasons.get(index, "a layer rule failed for it at an earlier step")
                    self._fail(state, index, f"{why}, so it takes the global path, which cannot run here: {error}",
                               demote=False)
        for index, uses in routes.items():
            if uses == "global":
                continue
            state.uses[index] = len(uses)
            for call, name, path in uses:
                if path is not None:  # hooked on a node below the layer (``pass_inputs``)
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
                release(call)
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
                for path in state.paths:  # a shared tensor's paths some of which no gradient reached
                    if isinstance(path, broadcast.Path):
                        path.complete()
                for call, tracked in state.calls.items():
                    if id(call) not in state.done:
                        self._run_rule(state, call, tracked)
                for index, uses in state.dense.items():
                    if index in state.failed:  # a use failed: the other uses' sum is not its gradient
                        continue
                    parts = uses["parts"] + ([] if uses["sum"] is None else [PerSample(
                        self.params[index], index, grad_batch=uses["sum"], batch_size=state.batch_size,
                        grad_before=state.grads_before[index])])
                    part = parts[0] if len(parts) == 1 else PerSample(
                        self.params[index], index, parts=parts, batch_size=state.batch_size,
                        grad_before=state.grads_before[index],
                    )
                    if index in state.dense_grads:  # the subsample's rows, the gradient of all samples
                        part.grad = state.dense_grads[index]
                    self._guarded(state, index, state.ready, index, part)
                for index in state.unreached:
                    self._accept(state, index, PerSample.zeros(self.params[index], index, state.held))
                for index in list(state.waiting):  # rules run here, or no gradient reached it (no hook fired)
                    self._on_accumulated(state, index)
                if state.window is not None:  # accumulated: this pass is checked on its own, then kept
                    check_gradients(state, self.params, self._fail)
                    state.window.add(state.pending, state.batch_size, state.failed)
                    return state.results, state.batch_size, state.flags
                if state.deferred:  # DDP, one backward pass: the global gradient first
                    window = Window(state.grads_before)
                    window.add(state.pending, state.batch_size, state.failed)
                    self._complete(state, window)
                state.batch.flush()
                for index, error in state.batch.failed:
                    if index not in state.failed:
                        self._fail(state, index, f"{type(error).__name__}: {error}")
                check_gradients(state, self.params, self._fail)
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
        inputs = [leaves[i] for i in trainable] if check else pass_inputs(state, leaves)
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
            i: torch.zeros_like(leaves[i]) if g is None else dense(g.detach()) for i, g in zip(trainable, grads)
        } if check else {}
        if state.sharded is not None:  # (FSDP2: this rank's rows of their mean over the ranks, as the rules')
            state.true_grads = {i: state.sharded.reduce_scatter([g / state.sharded.world], self.params[i])[0]
                                for i, g in state.true_grads.items()}
        return self.finish()

    # -- internals ----------------------------------------------------------------------

    def _unreached(self, state, graph, info):
        """The trainable parameters that the loss's graph does not reach (a layer this forward pass skips: a
        pooler, an auxiliary head): their individual gradients are zero, served as such in ``finish`` and
        checked against autograd's gradient there (nonzero if backward ran on another loss). Not FSDP2's
        sharded parameters (their ranks may skip different layers; the graph holds their unsharded copies),
        nor where a reentrant checkpoint segment hides its parameters from the graph until the backward pass
        (the global path refuses that step)."""
        if state.batch_size is None:
            return set()
        missed = {i for i, p in enumerate(self.params) if p.requires_grad and not is_sharded(p) and graph.misses(p)}
        if missed and global_path.reentrant_checkpoint(info.get("loss")):
            return set()
        return missed

    def _routes(self, calls, state, graph):
        """``{index: [(call, name in the module, broadcast path), ...] | "global"}`` for the
        parameters that took part (path ``None``: the call's rule on its own output gradient)."""
        by_module = {}
        for call in calls:
            by_module.setdefault(call.module, []).append(call)
        mixing = [c for c in calls if mixes_samples(c)]
        routes = {}
        for index, param in enumerate(self.params):
            if not param.requires_grad or index in state.unreached:  # frozen since, or unused (``_unreached``)
                continue
            if index in self.force_global:
                routes[index] = "global"
                continue
            uses = []
            owners = self._owners.get(index, ())
            # a tied parameter whose holder is never called (T5's `shared`, whose embedding is called as the encoder's
            # and the decoder's `embed_tokens`) is used where its other holders are; a use by a parent's own code as well
            # fails the check against autograd (NaN and a flag at that step, the global path from the next)
            called = [(module, name) for module, name in owners if module in by_module]
            for module, name in called or owners:
                while module not in by_module and module in self._parents:
                    module, child = self._parents[module]
                    name = f"{child}.{name}"
                uses += [(call, name) for call in by_module.get(module, ())]
            if not uses:
                continue
            routed = []
            for call, name in uses:
                route = route_use(call, name, param, calls, mixing, state, graph)
                if isinstance(route, str):  # (why it takes the global path)
                    state.global_reasons[index] = route
                    break
                routed.append(route)
            whole = [route for route in routed if route[0] is None]  # a path from the parameter: all its uses
            routes[index] = "global" if len(routed) < len(uses) else whole[:1] or routed
        return routes

    def _mixed(self, routes, info, needed_by, state, step_calls):
        """Whether the probe (``cockpit_lite.engine.independence``) found layers whose output gradients
        mix the samples: their parameters, and those served on paths outside any layer, take the global
        path from now on. A pseudo-loss's pass (the GGN's) probes from its own samples' terms."""
        served = {index: uses for index, uses in routes.items() if uses != "global"}
        calls = list(dict.fromkeys(  # the calls whose rules read rows of their output gradients
            call for uses in served.values() for call, _, path in uses if call is not None and path in (None, "attention")
        ))
        shared = [(index, *found)  # where shared tensors' paths read the batch's rows
                  for index, uses in served.items() for _, _, path in uses if path not in (None, "attention")
                  for found in broadcast.batch_nodes(*path)]
        models = (self.model, *self._roots)
        roots = [call for call in step_calls if any(call.module is model for model in models)]
        if state.pseudo is not None:
            loss, contributions = state.pseudo, (lambda: state.pseudo)
        else:
            loss, contributions = info.get("loss"), (lambda: info.contributions(", ".join(needed_by)))
        mixed = self._probe.mixed(calls, loss, contributions, roots, state.batch_size, shared)
        if not mixed:
            return False
        moved = [index for index, uses in served.items()  # (and the paths outside those rows)
                 if any(call in mixed or path not in (None, "attention") for call, _, path in uses)]
        self.force_global.update(moved)
        self._global_reasons.update(dict.fromkeys(moved, "code after its layer mixes the samples of the batch"))
        names = ", ".join(self.names[owner] if isinstance(owner, int) else owner.name or type(owner.module).__name__
                          for owner in mixed[:4])
        self._warn_once(("mixed", names), (
            f"cockpit-lite: the samples' losses depend on other samples' outputs of {names}"
            f"{', ...' if len(mixed) > 4 else ''} (code after them mixes the samples of the batch: a loss "
            "over pairs of samples such as a contrastive loss, or batch statistics computed outside a "
            "BatchNorm layer; or their first axis as long as the batch is not the samples' axis, as in a "
            "sequence-first [T, B, ...] input with T = B): the individual gradients of their parameters "
            "take the exact but slower global path, one backward pass per sample"
        ))
        return True

    def _leaf_result(self, state, index):
        def done(grad_batch):
            self._accept(state, index, PerSample(self.params[index], index, grad_batch=grad_batch))

        return done

    def _broadcast_result(self, state, call):
        def done(delta):
            self._run_rule(state, as_if_batched(call, state.batch_size, delta), state.broadcast[call])

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
                self._fail(state, index, f"{call.name or type(call.module).__name__}: {type(error).__name__}: {error}"
                                         f"{self._reentrant_hint()}")
            return
        finally:
            self.capture.paused = False
            if state.pseudo is None:  # read: the factors hold what they need of it
                release(call)
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
        that read ``g`` run on the subsample's rows kept for them (``Step.ready``)."""
        waiting = state.waiting.pop(index, None)
        if waiting is None:
            return
        part, results = waiting
        param = self.params[index]
        try:
            with torch.no_grad():
                grad = held(param) if param.grad is not None else torch.zeros_like(param)
                if state.grads_before[index] is not None:
                    grad = grad - state.grads_before[index]
                part.grad = grad.reshape(-1)
                results.update(_transforms.run([t for t in state.transforms if t.reads_grad], part, state.batch,
                                               state.scratch))
        except Exception as error:  # never a crash of the user's backward pass
            self._fail(state, index, f"{type(error).__name__}: {error}")

    def _reentrant_hint(self):
        """A rule's failure inside a reentrant ``torch.utils.checkpoint`` segment (its forward ran
        without a graph): the fix, else nothing."""
        loss = getattr(self._graph, "_loss", None)
        if torch.is_tensor(loss) and global_path.reentrant_checkpoint(loss):
            return (" (the loss runs through torch.utils.checkpoint(..., use_reentrant=True), whose layers run without "
                    f"a graph in the forward pass. Fix: {global_path.REENTRANT_FIX})")
        return ""

    def _guarded(self, state, index, work, *args):
        """``work(*args)`` on parameter ``index``'s individual gradients: a failure of what runs on them
        (the transforms, on a rule's output of an unforeseen form) is NaN and a flag, never a crash of
        the user's backward pass."""
        try:
            work(*args)
        except Exception as error:
            self._fail(state, index, f"{type(error).__name__}: {error}")

    def _accept(self, state, index, part, low_precision=False):
        """One use's individual gradients of parameter ``index`` (``_guarded``)."""
        self._guarded(state, index, self._take, state, index, part, low_precision)

    def _take(self, state, index, part, low_precision):
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

    def _complete(self, state, window):
        """DDP, one backward pass: its window's results (``Window.complete``), checked against autograd."""
        results, state.batch_size, grads, self.sizes = window.complete(self.params, state.transforms, self.group)
        state.results.update(results)
        self.pass_grads = grads
        for index, grad in grads.items():
            state.served[index] = None if state.grads_before[index] is not None else grad
        for index, error in window.errors.items():
            self._fail(state, index, f"{type(error).__name__}: {error}")
        nan_where_failed(state.results, window.failed)

    def complete(self, window, transforms, grads_after):
        """The results of an accumulated step, after its last backward pass.

        Returns:
            ``(results, batch_size, flags)`` of the effective batch (``cockpit_lite.engine.window``).
        """
        with torch.no_grad():
            results, batch_size, grads, sizes = window.complete(self.params, transforms, self.group, grads_after)
        if self.group is not None:
            self.sizes, self.pass_grads = sizes, grads
        nan_where_failed(results, window.failed)
        flags = []
        for index, error in window.errors.items():  # NaN and a flag, never a crash of the optimizer's step
            flags.append(self._failure(index, f"{type(error).__name__}: {error}"))
            self._nan_results(results, index, transforms, batch_size, batch_size)
        return results, batch_size, flags

    def _fail(self, state, index, reason, demote=True):
        """Mark a parameter's values of this step NaN; it takes the global path from now on
        (``demote``; not if the global path would not change the reason, nor for the zeros of a parameter
        the loss does not reach)."""
        state.failed.add(index)
        demote = demote and index not in state.unreached
        state.flags.append(self._failure(index, reason, demote, state.of_info_loss(index)))
        self._nan_results(state.results, index, state.transforms, state.held, state.batch_size, state.sharded)

    def _failure(self, index, reason, demote=True, of_info_loss=False):
        """The flag of parameter ``index``'s failure, with its warning (once) and, with ``demote``, the
        global path from the next step on (``of_info_loss``: its individual gradients were those of
        ``info["loss"]`` at this step, ``Step.of_info_loss``)."""
        if demote:
            self.force_global.add(index)
        name = self.names[index]
        if of_info_loss:
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
        return f"individual gradients of {name} unavailable at this step: {reason}"

    def _nan_results(self, results, index, transforms, samples, batch_size, sharded=None):
        """Parameter ``index``'s values in ``results`` NaN, of the shapes the transforms give (run on
        zeros where a value is missing)."""
        if {t.key for t in transforms} - results.get(index, {}).keys():
            zeros = PerSample.zeros(self.params[index], index, samples or 1, batch_size=batch_size)
            try:
                results[index] = (_transforms.run(transforms, zeros) if sharded is None
                                  else sharded.run(transforms, zeros)[0])
            except Exception:  # a transform that fails on any input: the quantities reading it fail, flagged
                results.setdefault(index, {})
        results[index] = {k: nan_like(v) for k, v in results[index].items()}

    def _leaves(self):
        """The tensors of the step's graph that stand for the tracked parameters (FSDP2: its unsharded ones)."""
        return self.params if self.group is None else self.group.leaves(self.model, self.params)

    def _aliases(self):
        """FSDP2: the unsharded parameters in the graph and the tracked ones they stand for."""
        return self.group.unsharded(self.model) if self.group is not None and self.model is not None else None

    def _note_global(self, state, indices):
        """Say once which parameters the plan of this step sends to the global path, and why (those the
        engine moved there after a failure or the probe's finding were named by their own warning)."""
        reasons = {}
        for index in indices:
            if state.global_reasons.get(index) and index not in self.force_global:
                reasons.setdefault(state.global_reasons[index], []).append(self.names[index])
        if not reasons:
            return
        count = sum(len(names) for names in reasons.values())
        told = "; ".join(f"{', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}: {why}"
                         for why, names in reasons.items())
        self._warn_once(("global", *sorted(i for i in indices if i in state.global_reasons)), (  # (the reasons may name shapes)
            f"cockpit-lite: the individual gradients of {count} parameter(s) take the exact but slow global "
            f"path, a vector-Jacobian product of each sample's loss ({state.batch_size} at this step), at every "
            f"tracked step ({told}). "
            "Fix: track the quantities that need individual gradients on a sparser schedule (docs/models.md "
            "lists what the fast rules serve)"
        ), stacklevel=5)  # (the user's `with cp(step)`)

    def _warn_once(self, key, message, stacklevel=4):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=stacklevel)
