"""The quantity interface: declare what a step needs, then compute from the step's data.

A quantity is asked twice per step:

1. ``needs(step, info) -> Needs | None`` before the backward pass: ``None`` when it
   has nothing to do at this step, otherwise the per-sample transforms, BackPACK
   extensions, info keys (via ``info.require``) and whether it needs Hessian-vector
   products. The orchestrator merges the needs of all quantities (a transform or
   extension needed twice is computed once) and knows nothing else about them.
   A quantity with ``Needs.hvp`` then gets ``before_backward(step, products)``, still
   before the user's backward pass: ``products.hvp(vectors)`` gives ``Hv`` for the
   step's loss (``cockpit_lite.curvature.hvp``, one gradient with graph shared by all
   such quantities and dropped afterwards); it does its products there and keeps what
   it needs for ``compute``.
2. ``compute(step, data) -> Output | list[Output] | None`` after the backward pass,
   from a ``StepData`` bundle. Values may be tensors; the orchestrator moves all of
   a step's values to the host in one go.
"""

from dataclasses import dataclass

import torch

from cockpit_lite import schedules
from cockpit_lite.output import Output  # noqa: F401 (where the quantities import it from)
from cockpit_lite.engine.rules.base import rerunning


@dataclass(frozen=True)
class Needs:
    """What a due quantity needs at one step.

    Attributes:
        transforms: per-sample transforms (``cockpit_lite.engine.transforms``), run in the backward pass.
        extensions: BackPACK extensions, run in the backward pass.
        hvp: Hessian-vector products ``Hv = ∇_θ(gᵀv)`` of the step's loss, before the
            backward pass: ``Quantity.before_backward`` is called with them. The user's
            ``loss.backward()`` stays plain (``create_graph`` is never needed).
        diagonals: curvature diagonals the engine computes before the backward pass
            (``cockpit_lite.curvature.ggn.Request``; each once per step, whoever asks), read
            with ``StepData.curvature(request)``.
    """

    transforms: tuple = ()
    extensions: tuple = ()
    hvp: bool = False
    diagonals: tuple = ()


#: Methods of Cockpit's quantity interface that cockpit-lite never calls: a subclass
#: overriding one would silently record its parent's value under its own name.
COCKPIT_ONLY_METHODS = (
    "_compute", "_compute_start", "_compute_end", "extensions", "extension_hooks",
    "protected_savefields", "track", "should_compute",
)


def input_module(model):
    """The module of ``model`` that receives the batch: ``model`` itself, or the first of a
    ``ModuleList`` of modules the training loop calls in turn (found given parameters only)."""
    return model[0] if isinstance(model, torch.nn.ModuleList) and len(model) else model


class Quantity:
    """Base class: a schedule and the two-phase interface above.

    A custom quantity subclasses ``Quantity`` (or ``SingleStepQuantity``) and defines
    ``needs`` (or ``TRANSFORMS`` / ``_needs``) and ``compute``; see the README section
    "Custom quantities". Its values land in the record under its class name.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cockpit_style = [name for name in COCKPIT_ONLY_METHODS if name in vars(cls)]
        if cockpit_style:
            raise TypeError(
                f"{cls.__name__} defines {', '.join(cockpit_style)}: methods of the original "
                "Cockpit's quantity interface, which cockpit-lite never calls (the parent's "
                "value would be recorded under this name). Fix: declare what a step needs in "
                "needs(step, info) -> Needs (per-sample transforms from cockpit_lite.engine.transforms, "
                "BackPACK extensions) and compute the value in compute(step, data) -> Output "
                "from the StepData bundle; see the README section 'Custom quantities'."
            )

    NEEDS_BACKWARD = True
    """Whether the values depend on the step's backward pass (gradients, per-sample
    statistics, curvature). A step whose context saw no backward pass of ``info["loss"]``
    records such a quantity as NaN with a flag instead of a value of stale gradients."""

    SCALED_BACKWARD = False
    """Whether the values change when the backward pass is scaled relative to ``info["loss"]``
    (a ``GradScaler``'s ``scaler.scale(loss).backward()``): they read the gradients of that pass
    at their scale, not ratios of them. A step whose backward pass was scaled flags such a
    quantity (``Cockpit``: the scale, and what to divide by it)."""

    MIN_BATCH_SIZE = 1
    """The fewest samples the statistic is defined for (2 for a variance across samples); a
    smaller batch records NaN with a flag."""

    SUBSAMPLE = False
    """Whether ``compute`` estimates the value at a subsampled step (``data.subset``,
    ``Cockpit(samples=k)``; ``cockpit_lite.subsample``), with its standard error in the
    ``meta``. At such a step a quantity that needs per-sample transforms and does not is
    NaN with a flag (and its transforms are not run)."""

    RANK_LOCAL = False
    """Whether ``needs`` may answer differently on the ranks of a torch.distributed run (it reads the rank's
    own data, e.g. whether its loss is finite). Such a quantity is asked at every step and the step runs
    only where another quantity is due as well (``StepContext``): the ranks take part in the same
    collectives. ``compute`` then joins what the ranks saw since (their steps in between included)."""

    TIER = None
    """The overhead budget's tier this quantity is expected to fall in before its first due step
    shows its ``Needs`` (an index into ``cockpit_lite.budget.TIERS``: 0 bookkeeping, 1
    per-sample, 2 curvature). ``None``: a ``SingleStepQuantity`` that keeps the base ``_needs``
    is read from its ``TRANSFORMS``; any other is planned as curvature until it has been seen
    (``cockpit_lite.budget.expected_tier``)."""

    STATE = ()
    """The attributes that carry from one step to the next (``θ₀``, the first half of a
    two-step value, a warm start): what ``state_dict`` saves and ``load_state_dict``
    restores, so that a resumed run records what the uninterrupted one would have. Their
    values are tensors (a tracked parameter itself is saved as a reference to it), Python
    numbers, strings, ``None``, ``torch.Generator`` and lists, tuples, dicts and sets of
    them (see ``cockpit_lite.state``). Empty for a quantity of one step's data."""

    def __init__(self, track_schedule=None, verbose=False):
        """
        Args:
            track_schedule: callable ``step -> bool``; default: every step.
            verbose: print a line whenever the quantity records a value.
        """
        self._track_schedule = track_schedule or schedules.linear(1)
        self._verbose = verbose
        self.output = {}

    def get_output(self):
        """This quantity's recorded values, ``{step: value}`` (as Cockpit's ``Quantity.get_output``)."""
        return self.output

    @property
    def name(self):
        """The key under which values are recorded (the class name, as in Cockpit)."""
        return type(self).__name__

    def is_due(self, step):
        """Whether the schedule asks for a value at ``step``."""
        return bool(self._track_schedule(step))

    def needs(self, step, info):
        """Return the ``Needs`` of this step, or ``None`` when there is nothing to do."""
        raise NotImplementedError

    def before_backward(self, step, products):
        """With ``Needs.hvp``: do this step's Hessian-vector products, before the user's backward pass.

        Args:
            step: the global step.
            products: a ``cockpit_lite.curvature.hvp.HessianVectorProducts``;
                ``products.hvp(vectors)`` is ``Hv`` per parameter. It is dropped after this
                call: keep detached results only. An exception here is raised again (or
                recorded as NaN with a flag) when the step's values are computed.
        """

    def observes(self, step):
        """Whether the engine must watch the forward pass of ``step`` (per-sample transforms)."""
        return False

    def compute(self, step, data):
        """Compute the value(s) of this step from ``data`` (a ``StepData``)."""
        raise NotImplementedError

    def bind(self, cockpit):
        """Called by ``Cockpit.add``: a quantity may read what it needs of the Cockpit."""

    def watch(self, model):
        """Called once the model is known: at ``Cockpit.add`` when the Cockpit was given it, or
        when the engine finds it in the first watched forward pass (given parameters only,
        then from the next forward pass on). A signal may install its own (cheap) hooks on it."""

    def unbind(self):
        """Called by ``Cockpit.close``: remove what ``bind`` installed."""

    def state_dict(self):
        """``{attribute: value}`` of the attributes named in ``STATE`` (references, not copies)."""
        return {name: getattr(self, name) for name in self.STATE}

    def load_state_dict(self, state):
        """Restore the attributes named in ``STATE`` from ``state_dict()``'s dict.

        Raises:
            ValueError: if ``state`` does not name exactly those attributes.
        """
        if not isinstance(state, dict) or set(state) != set(self.STATE):
            saved = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"{self.name}: the saved state holds {saved} but this version of {self.name} keeps "
                f"{sorted(self.STATE)}. Fix: resume with the cockpit-lite version that saved the state"
            )
        for name in self.STATE:
            setattr(self, name, state[name])

    def __repr__(self):
        return f"{self.name}()"


class SingleStepQuantity(Quantity):
    """A quantity computed from one step's data, due when its schedule says so.

    Subclasses declare ``INFO`` (the info keys they read, checked before backward)
    and either ``TRANSFORMS`` or an override of ``_needs``.
    """

    INFO = ()
    TRANSFORMS = ()
    SUBSAMPLE_TRANSFORMS = None
    """The transforms of a subsampled step, where they differ from ``TRANSFORMS``."""

    def needs(self, step, info):
        if not self.is_due(step):
            return None
        for key in self.INFO:
            info.require(key, self.name)
        return self._needs(step, info)

    def _needs(self, step, info):
        subsampled = getattr(info, "subset", None) is not None and self.SUBSAMPLE_TRANSFORMS is not None
        return Needs(transforms=tuple(t() for t in (self.SUBSAMPLE_TRANSFORMS if subsampled else self.TRANSFORMS)))

    def observes(self, step):
        return bool(self.TRANSFORMS) and self.is_due(step)


def total_and_layers(statistic, *per_layer_parts):
    """Evaluate ``statistic`` on whole-network sums and on each layer's parts.

    Args:
        statistic: function of the (summed) parts returning a tensor.
        *per_layer_parts: lists (one entry per parameter) of additive parts.

    Returns:
        ``(total, layers)``: ``statistic`` of the sums over layers, and the list of
        ``statistic`` of each layer's parts.
    """
    totals = [sum(parts) for parts in per_layer_parts]
    layers = [statistic(*parts) for parts in zip(*per_layer_parts)]
    return statistic(*totals), layers


def with_total(per_parameter):
    """``[..., L]`` values per parameter, with their sum over parameters prepended: ``[..., 1 + L]``."""
    return torch.cat([per_parameter.sum(-1, keepdim=True), per_parameter], -1)


def user_forward():
    """Whether a forward hook sees the user's own forward pass with gradients on: not a ``no_grad``
    evaluation, nor the engine's re-run of a module to form its individual gradients (whose
    vmapped tensors must not be kept, and whose calls are not the user's)."""
    return torch.is_grad_enabled() and not rerunning()


def floating_inputs(args, kwargs):
    """The floating-point tensors among a forward call's arguments (positional, then keyword) that have a
    batch axis: a 0-d tensor is a count or a scale beside the batch (the Hugging Face ``Trainer``'s
    ``num_items_in_batch=``, a float tensor under DDP), never the model's input."""
    return [a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.is_floating_point() and a.dim() > 0]
