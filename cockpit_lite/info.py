"""The ``info`` of one step: keys the user passed, and keys derived when a quantity needs them.

Keys
----
- ``"loss"``: the scalar mini-batch loss tensor (needed by ``Loss``, ``Alpha``, ``CABS``).
- ``"optimizer"``: the ``torch.optim.Optimizer`` that makes the step (``Alpha``,
  ``CABS``, ``EarlyStopping``), or a list of the optimizers that make it together
  (``cockpit_lite.optim.Optimizers``).
- ``"individual_losses"``: the per-sample losses. Derived when absent: the loss
  function's node in the autograd graph of ``info["loss"]`` (cross-entropy / NLL
  with class weights, ``ignore_index`` and ``label_smoothing``, MSE, Huber, smooth L1,
  BCE-with-logits, called with ``reduction="mean"`` or ``"sum"``) is re-evaluated with
  ``reduction="none"``. Either way they are normalised to the convention of
  ``cockpit_lite.engine.transforms``: ``ℓ_n`` such that ``mean_n ℓ_n`` is the mini-batch loss
  (for ``reduction="sum"`` that is ``B`` times the per-sample term).
- ``"batch_size"``: optional; derived from the individual gradients, and checked
  against them when given.

A quantity asks for a key with ``StepInfo.require(key, quantity)``; a key that is
missing and cannot be derived raises ``ValueError`` naming the key, the quantity
and the fix. The orchestrator asks before the backward pass runs.
"""

import math

import torch
import torch.nn.functional as F

from cockpit_lite.optim import joined

_MEAN, _SUM = 1, 2  # ATen's reduction codes saved in loss nodes


def _ignore_index(node):
    ignore_index = node._saved_ignore_index
    if ignore_index >= 2**63:  # saved as an unsigned 64-bit integer
        ignore_index -= 2**64
    return ignore_index


def _nll_loss(node):
    elements = F.nll_loss(
        node._saved_self,
        node._saved_target,
        weight=node._saved_weight,
        ignore_index=_ignore_index(node),
        reduction="none",
    )
    return elements, node._saved_total_weight


def _smoothed_cross_entropy(nll, smoothing):
    """Cross-entropy with ``label_smoothing=ε`` over ``C`` classes, from its NLL node.

    Per element ``e = (1 − ε) w_y (−log p_y) + (ε/C) Σ_c w_c (−log p_c)``, zero where
    the target is ``ignore_index`` (``w = 1`` without class weights); torch divides
    both terms of the mean by the NLL's total weight ``Σ w_y`` of the kept targets.
    """
    elements, denominator = _nll_loss(nll)
    log_p, weight = nll._saved_self, nll._saved_weight
    if weight is not None:
        log_p = log_p * weight.reshape(-1, *[1] * (log_p.dim() - 2))
    smooth = (-log_p.sum(1)).masked_fill(nll._saved_target == _ignore_index(nll), 0.0)
    return (1 - smoothing) * elements + (smoothing / log_p.shape[1]) * smooth, denominator


def _mse_loss(node):
    elements = (node._saved_self - node._saved_target) ** 2
    return elements, elements.numel()


def _bce_with_logits_loss(node):
    elements = F.binary_cross_entropy_with_logits(
        node._saved_self,
        node._saved_target,
        weight=node._saved_weight,
        pos_weight=node._saved_pos_weight,
        reduction="none",
    )
    return elements, elements.numel()


def _huber_loss(node):
    elements = F.huber_loss(node._saved_self, node._saved_target, reduction="none", delta=node._saved_delta)
    return elements, elements.numel()


def _smooth_l1_loss(node):
    elements = F.smooth_l1_loss(node._saved_self, node._saved_target, reduction="none", beta=node._saved_beta)
    return elements, elements.numel()


LOSS_NODES = {
    "NllLossBackward0": _nll_loss,
    "NllLoss2DBackward0": _nll_loss,
    "MseLossBackward0": _mse_loss,
    "BinaryCrossEntropyWithLogitsBackward0": _bce_with_logits_loss,
    "HuberLossBackward0": _huber_loss,
    "SmoothL1LossBackward0": _smooth_l1_loss,
}
"""Autograd node name of a loss function → ``node -> (unreduced losses, mean denominator)``."""

_SMOOTHING_TAIL = ("SumBackward0", "MaskedFillBackward0", "NegBackward0", "SumBackward1")
"""The smoothing term's nodes below its factor ε/C (a mean divides first, ``DivBackward0``)."""


def _loss_function(node):
    """``(node, derive, reduction)`` of the loss function whose output ``node`` makes: its own
    node (whose input is the loss input), ``derive(node)``, the reduction; ``(None, None, None)``
    for another node.

    Label smoothing makes cross-entropy a sum of two terms in the graph,
    ``(1 − ε) · NLL + (ε/C) · smoothing`` (``AddBackward0``); it is recognised by that
    structure and by the factors adding up (``(1 − ε)`` and ``ε/C``).
    """
    derive = LOSS_NODES.get(type(node).__name__)
    if derive is not None:
        return node, derive, getattr(node, "_saved_reduction", None)
    if type(node).__name__ != "AddBackward0" or getattr(node, "_saved_alpha", None) != 1:
        return None, None, None
    (first, _), (second, _) = node.next_functions
    if not all(type(n).__name__ == "MulBackward1" for n in (first, second)):
        return None, None, None
    nll = first.next_functions[0][0]
    if type(nll).__name__ not in ("NllLossBackward0", "NllLoss2DBackward0"):
        return None, None, None
    smoothing, reduction = 1 - first._saved_other, nll._saved_reduction
    tail = (("DivBackward0",) if reduction == _MEAN else ()) + _SMOOTHING_TAIL
    current = second
    for name in tail:
        current = current.next_functions[0][0] if current is not None and current.next_functions else None
        if type(current).__name__ != name:
            return None, None, None
    if not math.isclose(second._saved_other, smoothing / nll._saved_self.shape[1], rel_tol=1e-9):
        return None, None, None
    return nll, (lambda nll: _smoothed_cross_entropy(nll, smoothing)), reduction


def contributions_from_graph(loss, batch_size=None, keep_graph=False):
    """Each sample's term ``c_n`` of the reduced loss (``Σ_n c_n = loss``), from its autograd graph.

    For a mean-reduced loss ``L = Σ_{n,k} e_{n,k} / Z`` (``Z`` the element count, or the
    total class weight of NLL) ``c_n = Σ_k e_{n,k} / Z``; for a sum ``Z = 1``. A sample
    is one index of the batch axis: when the loss was evaluated on ``batch_size × T``
    rows (token losses of sequences flattened, ``logits.view(-1, V)``), the ``T`` rows of
    each sequence are summed: batch-major, or, where the graph shows the flattened tensor's
    batch axis elsewhere (a sequence-first ``[T, B, V]``, with ``batch_size`` given), along it.

    Args:
        loss: the mini-batch loss tensor.
        batch_size: the number of samples ``B`` (``None``: one per row of the loss input).
        keep_graph: return ``c`` attached to the forward graph (for the exact global path
            of ``cockpit_lite.engine``); otherwise detached.

    Raises:
        ValueError: if the graph does not end in a supported loss function, or its rows
            are not a multiple of ``batch_size``.
    """
    function, derive, reduction, factor = loss_function_of(loss)
    with torch.set_grad_enabled(keep_graph):
        elements, denominator = derive(function)
        per_row = elements.reshape(elements.shape[0], -1).sum(1)
        if reduction == _MEAN:
            per_row = per_row / denominator
        if factor != 1.0:
            per_row = per_row * factor
        sizes = _flattened_sizes(function, per_row.shape[0])
        if batch_size is None:
            batch_size = None if sizes is None else sizes[0]
        if sizes is not None and sizes[0] != batch_size and batch_size in sizes:  # (sequence-first: [T, B, ...])
            axis = sizes.index(batch_size)
            return per_row.reshape(sizes).movedim(axis, 0).reshape(batch_size, -1).sum(1)
        return per_sequence(per_row, batch_size)


def loss_function_of(loss):
    """``(loss function's node, derive, reduction, factor)`` of ``loss = factor · loss function``.

    Raises:
        ValueError: naming the fix, if ``loss`` has no graph or ends in no supported loss function.
    """
    if loss.grad_fn is None:
        raise ValueError(
            "info['loss'] has no autograd graph (it was detached, made by .item() or computed "
            "under torch.no_grad()), so its samples' losses cannot be read from it. Fix: pass "
            "the loss tensor itself, the one loss.backward() is called on"
        )
    node, factor = _unscaled(loss.grad_fn)
    function, derive, reduction = _loss_function(node)
    penalty = penalty_term(loss) if derive is None else None
    if penalty is not None:
        raise ValueError(f"cannot derive 'individual_losses': {penalty}")
    if derive is None or reduction not in (_MEAN, _SUM):
        raise ValueError(
            "cannot derive 'individual_losses': info['loss'] must come from a "
            "cross-entropy/NLL (label smoothing too), MSE, Huber, smooth-L1 or BCE-with-logits "
            "loss with reduction 'mean' or "
            f"'sum', optionally times a constant (its autograd node is {type(node).__name__}). "
            "Pass them yourself: info={'individual_losses': "
            "lossfunc_with_reduction_none(output, target), ...}"
        )
    return function, derive, reduction, factor


PENALTY_FIX = (
    "backpropagate the data loss inside the context and add the penalty's gradient outside it "
    "(`with cp(step, info={'loss': data_loss, ...}): data_loss.backward()`, then "
    "`penalty.backward()` before `optimizer.step()`; the statistics then describe the data loss), "
    "or leave the penalty out of the loss and use the optimizer's weight_decay (weight_decay=2*lam "
    "for lam * sum(p.square().sum() for p in params), with SGD or Adam)"
)
"""The fix for a loss with a penalty on the parameters (``penalty_term``)."""


def penalty_term(loss, parameters_only=False):
    """Why ``loss`` has no per-sample terms to derive, if it is a supported loss function plus other
    terms (``ce + lam * l2``): the cause, naming the added term's autograd node, and the fix; else
    ``None`` (also for a term of the model's outputs, with ``parameters_only``).

    The sum's addends are read through additions, subtractions and constant factors. An added
    term whose graph shares no node with the loss function's, parameters aside, reads no sample of
    the batch: a penalty on the parameters (an explicit L2 term), which has no per-sample share;
    one that shares nodes is a term of the model's outputs (an activation penalty), which may have
    one, but not one the graph shows.
    """
    root = getattr(loss, "grad_fn", None)
    if root is None:
        return None
    functions, others, queue = [], [], [root]  # breadth first: the outermost terms first
    while queue and len(functions) + len(others) < 10_000:  # (a penalty summed over every parameter)
        try:
            node, _ = _unscaled(queue.pop(0))
            function = _loss_function(node)[1]
        except RuntimeError:  # its saved tensors are gone (the graph was backpropagated): nothing to tell
            return None
        if function is not None:
            functions.append(node)
        elif type(node).__name__ in ("AddBackward0", "SubBackward0"):
            queue.extend(child for child, _ in node.next_functions if child is not None)
        else:
            others.append(node)
    if not functions or not others:
        return None
    start = f"info['loss'] is a loss function ({type(functions[0]).__name__}) plus "
    if not _below(functions) & _below(others):
        return (
            f"{start}a term that reads no sample of the batch (its autograd node is "
            f"{type(others[0]).__name__}): a penalty on the parameters, such as an explicit L2 term, "
            f"is no sum of per-sample terms. Fix: {PENALTY_FIX}"
        )
    return None if parameters_only else (
        f"{start}another term of the model's outputs (its autograd node is {type(others[0]).__name__}, "
        "e.g. an activation penalty), whose share per sample the graph does not show. Fix: pass "
        "info['individual_losses'] = each sample's share of the whole loss (e.g. "
        "ce_none + penalty_per_sample), whose mean is info['loss']"
    )


def _below(nodes):
    """The autograd nodes ``nodes`` depend on, the accumulators of parameters (``nn.Parameter``) left out."""
    seen, stack = set(), list(nodes)
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        if isinstance(getattr(node, "variable", None), torch.nn.Parameter):
            continue
        seen.add(node)
        stack.extend(child for child, _ in node.next_functions)
    return seen


def batch_size_from_graph(loss):
    """``B`` read from ``loss``'s graph where its loss function has one input row per sample
    (``[B, C]`` logits, ``[B, ...]`` outputs); ``None`` where the rows were flattened from
    sequences (``[B, T, C]`` viewed as ``[B·T, C]``: for a sequence-first model the first axis
    is ``T``, so the graph does not tell), or the loss is no loss function of
    ``contributions_from_graph``'s."""
    try:
        function, derive, _, _ = loss_function_of(loss)
        with torch.no_grad():
            rows = derive(function)[0].shape[0]
    except (RuntimeError, ValueError):  # no such loss, or its saved tensors are gone (after backward)
        return None
    return rows if _flattened_sizes(function, rows) is None else None


def _unscaled(node):
    """``(loss node, factor)``: ``loss = factor · (loss function's value)``, looking through
    an extended loss module's hook and multiplications or divisions by constants (a loss
    divided by the number of accumulation steps, or scaled for unequal DDP shards)."""
    factor = 1.0
    while node is not None:
        name = type(node).__name__
        if name == "BackwardHookFunctionBackward":
            node = node.next_functions[0][0]
            continue
        if name not in ("MulBackward0", "DivBackward0"):
            break
        (first, _), (second, _) = node.next_functions
        other = getattr(node, "_saved_other", None)
        if second is None and torch.is_tensor(other) and other.numel() == 1:
            factor = factor * float(other) if name == "MulBackward0" else factor / float(other)
            node = first
        elif name == "MulBackward0" and first is None and torch.is_tensor(getattr(node, "_saved_self", None)):
            factor *= float(node._saved_self)
            node = second
        else:
            break
    return node, factor


_VIEWS = {"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "LogSoftmaxBackward0", "FlattenBackward0"}


def _flattened_sizes(node, rows):
    """The leading sizes ``[B, T, ...]`` (or ``[T, B, ...]``) of loss inputs flattened from
    ``[B, T, ..., C]`` (``logits.view(-1, C)``), whose product is ``rows``.

    Follows the loss input's graph up through log-softmax and views to the shape it had
    before the flattening; ``None`` when the rows were not flattened (one row per sample).
    """
    current = node.next_functions[0][0] if node.next_functions else None
    while current is not None and type(current).__name__ in _VIEWS:
        sizes = getattr(current, "_saved_self_sym_sizes", None)
        if sizes is not None and len(sizes) >= 3 and math.prod(sizes[:-1]) == rows:
            return [int(size) for size in sizes[:-1]]
        current = current.next_functions[0][0] if current.next_functions else None
    return None


def per_sequence(per_row, batch_size):
    """Sum ``[B·T]`` per-row values to ``[B]`` per-sample values (rows batch-major).

    Raises:
        ValueError: if the number of rows is not a multiple of ``batch_size``.
    """
    if batch_size is None or per_row.shape[0] == batch_size:
        return per_row
    if per_row.shape[0] % batch_size:
        raise ValueError(
            f"the loss has {per_row.shape[0]} rows, which is not a multiple of the batch "
            f"size {batch_size}: cannot tell which rows belong to which sample. Pass "
            "info['individual_losses'] with one loss per sample (sum each sequence's "
            "token losses) and info['batch_size']."
        )
    return per_row.reshape(batch_size, -1).sum(1)


def individual_losses_from_graph(loss, batch_size=None):
    """Derive the per-sample losses ``ℓ_n = B c_n`` (``mean_n ℓ_n = loss``) from ``loss``'s autograd graph."""
    contributions = contributions_from_graph(loss, batch_size)
    return contributions * contributions.shape[0]


def normalise_individual_losses(losses, loss, batch_size=None, keep_graph=False):
    """Bring user-given unreduced losses to the convention ``mean_n ℓ_n = loss``.

    ``losses`` has shape ``[B, ...]`` (``reduction="none"`` of the same loss
    function), or ``[B·T]`` token losses of ``B`` sequences (flattened batch-major),
    which are grouped per sequence first. If their mean is ``loss`` (``reduction="mean"``), ``ℓ_n`` is the mean
    over sample n's entries; if their sum is ``loss`` (``reduction="sum"``),
    ``ℓ_n = B ×`` the sum over sample n's entries. Without a finite ``loss`` to
    compare with, the mean is assumed.

    Raises:
        ValueError: if they reduce to ``loss`` by neither mean nor sum.
    """
    losses = torch.as_tensor(losses)
    if not keep_graph:
        losses = losses.detach()
    if losses.dim() == 0:
        raise ValueError("info['individual_losses'] must have one entry per sample, got a scalar")
    if batch_size is not None and losses.shape[0] != batch_size:
        if losses.numel() % batch_size:
            raise ValueError(
                f"info['individual_losses'] has {losses.numel()} entries for a batch of "
                f"{batch_size} samples; pass one loss per sample (or per token of each sequence)"
            )
        losses = losses.reshape(batch_size, -1)
    entries = losses.reshape(losses.shape[0], -1)
    if loss is None or not torch.isfinite(loss).all():
        return entries.mean(1)
    value = loss.detach().to(entries.dtype)
    tol = dict(rtol=1e-4, atol=1e-6)
    if torch.allclose(entries.detach().mean(), value, **tol):
        return entries.mean(1)
    if torch.allclose(entries.detach().sum(), value, **tol):
        return entries.sum(1) * entries.shape[0]
    message = (
        "info['individual_losses'] reduce to neither the loss (mean) nor to it by "
        f"summing: mean {entries.mean().item():.6g}, sum {entries.sum().item():.6g}, "
        f"loss {value.item():.6g}"
    )
    penalty = penalty_term(loss)
    if penalty is not None:
        raise ValueError(f"{message}: {penalty}")
    raise ValueError(f"{message}. Pass lossfunc(output, target) with reduction='none' for the same batch.")


class StepInfo:
    """Read access to one step's ``info``, deriving and validating keys on request."""

    def __init__(self, info, step, batch_size=None, model=None):
        """
        Args:
            info: the user's dict.
            step: the global step.
            batch_size: the number of samples the engine saw in the forward pass (used
                to group token losses per sequence), if known.
            model: the ``torch.nn.Module`` the Cockpit tracks, if it was given one.
        """
        if info is not None and not isinstance(info, dict):
            raise TypeError(f"info must be a dict, got {type(info).__name__}")
        self.step = step
        self.model = model
        self._given = dict(info or {})
        if "optimizer" in self._given:  # (several: one ``Optimizers`` for them all)
            self._given["optimizer"] = joined(self._given["optimizer"])
        self._cache = {}
        self._derived = {}
        given = self._given.get("batch_size")
        self.batch_size = int(given) if given is not None else batch_size
        self.subset = None
        """The indices of the ``k`` samples a subsampled step's individual gradients are formed
        for (``Cockpit(samples=k)``, ``cockpit_lite.subsample``), or ``None`` (all of them)."""

    @classmethod
    def merged(cls, infos):
        """The info of an accumulated step: one batch, the union of its micro-batches.

        The optimizer steps on ``L = Σ_m L_m`` (each micro-batch backpropagates its own
        loss ``L_m``), so ``loss`` is that sum. Micro-batch ``m``'s individual losses
        (``mean_n ℓ_n = L_m`` over its ``B_m`` samples) become ``ℓ_n · B / B_m``, so that
        ``mean_n ℓ_n = L`` over the ``B = Σ_m B_m`` samples. Every other key is the last
        micro-batch's.
        """
        last = infos[-1]
        info = cls(last._given, last.step, model=last.model)
        info._cache = {k: v for k, v in last._cache.items() if k not in ("loss", "individual_losses")}
        losses = [i._cache.get("individual_losses") for i in infos]
        sizes = [l.shape[0] if l is not None else i.batch_size for l, i in zip(losses, infos)]
        info.batch_size = None if None in sizes else sum(sizes)
        if info._given.get("batch_size") is not None:
            info._given["batch_size"] = info.batch_size
        given = [i._given.get("loss") for i in infos]
        if all(torch.is_tensor(l) for l in given):
            info._given["loss"] = sum(l.detach().reshape(()) for l in given)
            if all("loss" in i._cache for i in infos):
                info._cache["loss"] = info._given["loss"]
        info._given.pop("individual_losses", None)  # the last micro-batch's, not the step's
        if all(l is not None for l in losses):
            info._cache["individual_losses"] = torch.cat(
                [l * (info.batch_size / b) for l, b in zip(losses, sizes)]
            )
        return info

    def __contains__(self, key):
        return key in self._given

    def derived(self, key, make):
        """A value of this step that the library derives once and shares (``make()`` on the first
        call, kept for the step; an exception ``make`` raises is kept and raised again)."""
        if key not in self._derived:
            try:
                self._derived[key] = (make(), None)
            except Exception as error:
                self._derived[key] = (None, error)
        value, error = self._derived[key]
        if error is not None:
            raise error
        return value

    def get(self, key, default=None):
        """The value the user passed for ``key`` (not derived), or ``default``."""
        return self._given.get(key, default)

    def require(self, key, quantity):
        """Return the (validated or derived) value of ``key``, needed by ``quantity``.

        Raises:
            ValueError: naming the key, the quantity and the fix, if it is missing and
                cannot be derived or is malformed.
        """
        if key not in self._cache:
            self._cache[key] = self._resolve(key, quantity)
        return self._cache[key]

    def _resolve(self, key, quantity):
        where = f"{quantity} needs info['{key}'] at step {self.step}"
        if key == "individual_losses":
            try:
                if key in self._given:
                    return normalise_individual_losses(self._given[key], self._given.get("loss"), self.batch_size)
                return individual_losses_from_graph(self.require("loss", quantity), self.batch_size)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
        if key not in self._given:
            raise ValueError(
                f"{where}; pass it as cp(step, info={{'{key}': ...}}) around loss.backward()."
            )
        value = self._given[key]
        if key == "loss" and not (torch.is_tensor(value) and value.numel() == 1):
            raise ValueError(f"{where} as a scalar tensor (the mini-batch loss), got {value!r}")
        if key == "optimizer" and not isinstance(value, torch.optim.Optimizer):
            raise ValueError(f"{where} as a torch.optim.Optimizer (several that step the model together: "
                             f"a list of them), got {type(value).__name__}")
        return value

    def contributions(self, needed_by):
        """``c_n`` (``Σ_n c_n = loss``) attached to the forward graph, for the exact global path.

        From ``info["individual_losses"]`` when they were passed with their graph, else
        derived from the loss's graph.

        Raises:
            ValueError: naming the fix, when neither is possible.
        """
        given = self._given.get("individual_losses")
        try:
            if torch.is_tensor(given) and given.grad_fn is not None:
                losses = normalise_individual_losses(given, self._given.get("loss"), self.batch_size, keep_graph=True)
                return losses / losses.shape[0]
            return contributions_from_graph(self.require("loss", needed_by), self.batch_size, keep_graph=True)
        except ValueError as error:
            raise ValueError(
                f"{needed_by} need(s) the individual gradients of parameters that only the exact "
                f"global path can reach at step {self.step}, which needs each sample's loss with "
                f"its graph: {error} (pass info['individual_losses'] = loss_fn(output, target) "
                "with reduction='none', not detached)"
            ) from None
