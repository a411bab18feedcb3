"""The diagonal of the generalised Gauss-Newton matrix from the per-sample engine, on any model.

With ``f_n`` sample n's outputs (the loss function's input), ``J_n = ∂f_n/∂θ`` through the
whole graph (BatchNorm in training mode: through the batch statistics; tied weights: every use)
and a symmetric factor of the loss's Hessian in the outputs, ``∇²_{f_n} L = Σ_c s_nc s_ncᵀ``,

    G = Σ_n J_nᵀ (∇²_{f_n} L) J_n,        diag G = Σ_c Σ_n (J_nᵀ s_nc)²          (exact)

(Schraudolph, 2002; Martens, 2014). ``J_nᵀ s_nc`` is sample n's gradient of the pseudo-loss
``Σ_n ⟨s_nc, f_n⟩``, so each column ``c`` is one backward pass of the engine
(``Engine.pseudo_pass``: the same layer rules and global path as the first-order statistics)
whose ``Σ_n (·)²`` is the ``SumGradSquared`` transform. The first pass of a step is checked
against autograd's gradient of its pseudo-loss (a parameter that fails it, used somewhere the
rules do not see, takes the global path, and the pass runs again); the others skip the weight
gradients of the layers the rules serve (autograd is asked for their output gradients only). The factor, per row of the loss input
(a sample, or one position of a sequence or an image), for the loss functions the engine
derives individual losses of (``cockpit_lite.info``):

- cross-entropy (NLL of a log-softmax over the classes, with class weights, ``ignore_index`` and
  label smoothing): a row's loss is ``Σ_c q_c (−log p_c)`` with ``q`` independent of the logits
  ``z``, so its Hessian in ``z`` is ``κ (diag p − p pᵀ)`` with ``κ = Σ_c q_c`` (read from the graph
  as the loss's gradient in the log-probabilities). It has rank ``C − 1`` (``𝟙`` is in its null
  space), so its ``C − 1`` other eigenpairs, ``s_c = √λ_c v_c`` (``torch.linalg.eigh`` per row, in
  float64), are a factor with one column fewer than ``√(κ p_c) (e_c − p)``. Orthogonal to ``𝟙``,
  they sum to zero, so the backward pass starts at the log-probabilities with ``s_c`` itself (the
  log-softmax's backward maps a zero-sum vector to itself). The outputs are the logits, also
  for a model ending in a log-softmax layer with an NLL loss (in the log-probabilities the loss
  is linear and its GGN zero);
- MSE, BCE-with-logits (weights, ``pos_weight``), Huber and smooth L1: elementwise, the Hessian
  is diagonal, ``h = ∂²L/∂f²`` elementwise (read from the graph by a double backward pass), and
  ``s_k = √h_k e_k``.

The exact diagonal takes one pass per row position and class but one (``R · (C − 1)`` for ``R`` rows
a sample, ``C`` classes) or per output element. The Monte-Carlo diagonal (``"diag_ggn_mc"``) takes one
pass per draw: a sampled label ``ŷ ~ p`` per row (``s = √κ (p − e_ŷ)``) or a Rademacher sign per
element (``s = √h ⊙ ε``); ``E[s sᵀ]`` is the row's Hessian, draws of different rows are
independent with mean zero, so every pass is unbiased for diag G and ``K`` passes give the mean
with a jackknife standard error (``cockpit_lite.curvature.jackknife``). Draws come from a
generator seeded by ``(seed, step)`` (``subsample.seed_of``: the same draws in every run and
process); the user's random state is never touched.

Under ``torch.distributed`` the diagonal is of the mean of the ranks' losses (the loss DDP and FSDP2
step with), ``(1/W) Σ_r diag G_r``: under DDP each rank runs its passes on its samples and the ranks'
diagonals are averaged (one all-reduce); on a model sharded by FSDP2 every pass's ``Σ_n g̃_n²`` is
reduce-scattered in the layers' backward passes (``cockpit_lite.sharded``), and the diagonal is
sharded as the parameter. (A Monte-Carlo draw differs from one process's: each rank draws for its own
samples.)
"""

from dataclasses import dataclass

import torch

from cockpit_lite.curvature.jackknife import GroupedEstimate
from cockpit_lite.info import contributions_from_graph, loss_function_of
from cockpit_lite.engine.transforms import SumGradSquared
from cockpit_lite.subsample import seed_of

EXACT, MONTE_CARLO = "diag_ggn_exact", "diag_ggn_mc"
SOFTMAX_NODES = ("NllLossBackward0", "NllLoss2DBackward0")
ELEMENTWISE_NODES = (
    "MseLossBackward0", "BinaryCrossEntropyWithLogitsBackward0", "HuberLossBackward0", "SmoothL1LossBackward0",
)


@dataclass(frozen=True)
class Request:
    """A diagonal the engine computes before the user's backward pass (``Needs.diagonals``).

    Attributes:
        method: ``"diag_ggn_exact"`` or ``"diag_ggn_mc"``.
        samples: Monte-Carlo draws per step (``"diag_ggn_mc"``).
        seed: seed of the draws' generator, combined with the step.
    """

    method: str
    samples: int = 1
    seed: int = 0

    def compute(self, engine, info, needed_by):
        """The ``Diagonal`` of this step (``diagonal``)."""
        return diagonal(engine, info, self, needed_by)


class Unsupported(ValueError):
    """The loss has no curvature factor the engine knows (the message says why)."""


class OutputCurvature:
    """The loss's Hessian in the model's outputs, as the factor's columns (see the module docstring).

    Attributes:
        outputs: the tensor of the graph the passes start from (the loss function's input).
        batch_size: ``B``.
        passes: the number of exact passes (``R · C``, or the output elements per sample).
    """

    def __init__(self, loss, batch_size=None):
        """
        Raises:
            Unsupported: naming the reason, for a loss without a factor the engine knows.
        """
        try:
            function, _, _, _ = loss_function_of(loss)
        except ValueError as error:
            raise Unsupported(str(error)) from None
        name = type(function).__name__
        if name not in SOFTMAX_NODES + ELEMENTWISE_NODES:
            raise Unsupported(f"the engine has no curvature factor of {name}")
        outputs = function._saved_self
        self.softmax = name in SOFTMAX_NODES
        if self.softmax:
            node = outputs.grad_fn
            if type(node).__name__ != "LogSoftmaxBackward0" or node._saved_dim not in (1, 1 - outputs.dim()):
                raise Unsupported(
                    "the NLL loss's input is not a log-softmax over the classes (its autograd node is "
                    f"{type(node).__name__}): the loss is linear in it, and its curvature in the model's "
                    "outputs is unknown. Fix: compute the loss as cross_entropy(logits, target)"
                )
        contributions = contributions_from_graph(loss, batch_size, keep_graph=True)
        self.batch_size = contributions.shape[0]
        self.outputs = outputs
        with torch.enable_grad():
            first = torch.autograd.grad(contributions.sum(), outputs, retain_graph=True, create_graph=not self.softmax)[0]
            if self.softmax:  # q = -∂L/∂(log p): the row's weight κ = Σ_c q_c, and p
                classes = outputs.shape[1]
                self._p = _rows(outputs.detach().exp(), self.batch_size, classes)
                self._kappa = _rows(-first.detach(), self.batch_size, classes).sum(-1).clamp(min=0)
                self.passes = self._p.shape[1] * (classes - 1)
            else:  # h = ∂²L/∂f², elementwise
                second = torch.autograd.grad(first.sum(), outputs, retain_graph=True)[0]
                self._h = second.detach().reshape(self.batch_size, -1).clamp(min=0)
                self.passes = self._h.shape[1]

    def columns(self):
        """Yield the exact factor's columns, each shaped like ``outputs`` (all samples' at once)."""
        if self.softmax:  # the C − 1 eigenpairs of κ (diag p − p pᵀ) besides 𝟙's, whose eigenvalue is 0
            rows = self._p.shape[1]
            for row in range(rows):
                p, kappa = self._p[:, row].double(), self._kappa[:, row].double()
                values, vectors = torch.linalg.eigh(kappa[:, None, None] * (torch.diag_embed(p) - p[:, :, None] * p[:, None]))
                factor = (vectors * values.clamp(min=0).sqrt()[:, None]).to(self._p.dtype)
                for c in range(1, factor.shape[-1]):  # (ascending: the first is 𝟙's)
                    column = torch.zeros_like(self._p)
                    column[:, row] = factor[..., c]
                    yield self._unrows(column)
        else:
            for element in range(self._h.shape[1]):
                column = torch.zeros_like(self._h)
                column[:, element] = self._h[:, element].sqrt()
                yield column.reshape(self.outputs.shape)

    def draw(self, generator):
        """One Monte-Carlo column, shaped like ``outputs``: ``E[s sᵀ]`` is each row's Hessian."""
        if self.softmax:
            p = self._p
            labels = torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=generator).reshape(p.shape[:-1])
            hot = torch.nn.functional.one_hot(labels, p.shape[-1]).to(p.dtype)
            return self._unrows(self._kappa.sqrt()[..., None] * (p - hot))
        signs = torch.randint(0, 2, self._h.shape, generator=generator, device=self._h.device).to(self._h.dtype) * 2 - 1
        return (self._h.sqrt() * signs).reshape(self.outputs.shape)

    def contributions(self, column):
        """The samples' terms ``⟨s_n, f_n⟩`` of the pseudo-loss of ``column``, ``[B]``, with graph."""
        with torch.enable_grad():
            return (column.to(self.outputs.dtype) * self.outputs).reshape(self.batch_size, -1).sum(1)

    def _unrows(self, values):
        """``[B, R, C]`` rows back to the layout of ``outputs`` (``[N, C, *positions]``)."""
        moved_shape = (self.outputs.shape[0], *self.outputs.shape[2:], self.outputs.shape[1])
        return values.reshape(moved_shape).movedim(-1, 1).to(self.outputs.dtype)


def _rows(values, batch_size, classes):
    """``[N, C, *positions]`` as ``[B, R, C]``: each sample's rows (positions, sequence steps)."""
    return values.movedim(1, -1).reshape(batch_size, -1, classes)


def output_curvature(info):
    """The step's ``OutputCurvature`` (derived once per step and shared).

    Raises:
        Unsupported: naming the reason.
    """
    return info.derived("output_curvature", lambda: OutputCurvature(info.require("loss", "the GGN diagonal"),
                                                                     info.batch_size))


def support(info, max_passes=None):
    """Why the engine cannot give the GGN diagonal of this step (within ``max_passes`` exact
    passes), or ``None`` when it can."""
    try:
        curvature = output_curvature(info)
    except (Unsupported, ValueError) as error:
        return f"the engine has no exact GGN diagonal for this loss ({error})"
    if max_passes is not None and curvature.passes > max_passes:
        return (
            f"the engine's exact GGN diagonal takes {curvature.passes} backward passes per step "
            f"(one per output row position and class), more than max_passes={max_passes}"
        )
    return None


class Diagonal:
    """The engine's diagonal of one step.

    Attributes:
        method: the request's method.
        diagonal: per parameter (``None`` until computed).
        passes: the backward passes it took.
        flags: what went wrong for some parameters (their entries are NaN).
        estimate: the ``GroupedEstimate`` of a Monte-Carlo diagonal (``standard_error``), else ``None``.
    """

    def __init__(self, method, passes, diagonal, flags, estimate=None):
        self.method, self.passes, self.diagonal, self.flags, self.estimate = method, passes, diagonal, flags, estimate


def diagonal(engine, info, request, needed_by):
    """The diagonal ``request`` asks for, from the engine's passes (before the user's backward pass).

    Args:
        engine: the Cockpit's ``Engine`` (its capture watched the step's forward pass).
        info: the step's ``StepInfo``.
        request: a ``Request``.
        needed_by: the names of the quantities that need it (for messages).

    Returns:
        A ``Diagonal``.
    """
    curvature = output_curvature(info)
    batch_size = curvature.batch_size
    transform = SumGradSquared()
    params = engine.params
    flags = []
    group = engine.group
    sharded = group is not None and group.sharded  # FSDP2: the passes reduce over the ranks (ShardedGroup.run)
    world = group.world if sharded else 1
    ranks = group if group is not None and not sharded else None  # DDP: each rank's passes, averaged below

    def one_pass(column, check):
        results, size, pass_flags = engine.pseudo_pass(
            (transform,), info, batch_size, curvature.outputs, column, curvature.contributions(column), needed_by,
            check,
        )
        flags.extend(f"the GGN diagonal's backward pass: {flag}" for flag in pass_flags)
        scale = (size / world) ** 2 * world  # Σ_n g̃_n² over every rank's samples, g̃_n = (B / W) J_nᵀ s_n
        return [
            results[i][transform.key] / scale if i in results else torch.zeros_like(p, dtype=_wide(p))
            for i, p in enumerate(params)
        ]

    def first_pass(column):
        """The step's first pass, checked; run again where the check sent a parameter to the global path
        (a use the layer rules did not see: the global path serves it exactly from then on)."""
        demoted = set(engine.force_global)
        parts = one_pass(column, check=True)
        if engine.force_global - demoted:
            flags.clear()
            parts = one_pass(column, check=True)
        return parts

    if request.method == EXACT:
        total = [torch.zeros_like(p, dtype=_wide(p)) for p in params]
        for number, column in enumerate(curvature.columns()):
            for t, part in zip(total, first_pass(column) if number == 0 else one_pass(column, check=False)):
                t.add_(part.to(t.dtype))
        return Diagonal(EXACT, curvature.passes, total if ranks is None else ranks.mean(total), _unique(flags))
    generator = torch.Generator(device=curvature.outputs.device)
    generator.manual_seed(seed_of("ggn", request.seed, info.step))
    estimate = GroupedEstimate([torch.empty_like(p, dtype=_wide(p)) for p in params], request.samples)
    for k in range(request.samples):
        column = curvature.draw(generator)
        estimate.add(k, [part[None] for part in (first_pass(column) if k == 0 else one_pass(column, check=False))])
    if ranks is not None:
        estimate.group_sums = ranks.mean(estimate.group_sums)
    estimate.finish()
    return Diagonal(MONTE_CARLO, request.samples, estimate.diagonal, _unique(flags), estimate)


def _wide(param):
    return torch.promote_types(param.dtype, torch.float32)


def _unique(flags):
    return list(dict.fromkeys(flags))

