"""The exact global path: individual gradients as batched vector-Jacobian products of the
individual losses, through the whole graph of the forward pass.

``∇_θ c_n`` for every sample n of ``c`` (the contributions of the samples to the reduced
loss, ``Σ_n c_n = L``, still attached to the forward graph) is the vector-Jacobian
product of ``c`` with the unit vector ``e_n``; ``torch.autograd.grad(c, θ,
grad_outputs=I[chunk], is_grads_batched=True)`` computes a chunk of them in one
vectorised backward pass. This is exact for every differentiable model, whatever mixes
the samples (BatchNorm in training mode: the dependence of ``c_n`` on the other
samples through the batch statistics is part of ``∇_θ c_n``), whatever uses a parameter
(tied weights: every use is summed), at the price of one backward pass per sample
(vectorised). It runs when the step begins, before the user's ``loss.backward()``,
with the graph retained for it. Chunks bound the memory: at most about
``CHUNK_ELEMENTS`` individual-gradient elements exist at a time.

Vectorising is not always faster: ``vmap`` over the backward pass of convolutions and
BatchNorm runs 2.5x slower than a loop of ordinary backward passes on the CPU
(measured on a small ResNet, batch 64), while it wins on small dense layers. The
first call times both on the first few samples and keeps the faster (``Mode``).

Each backward pass runs under a forked random state (the CPU's and that of the GPUs of
the parameters), restored after it (``forked_random_state``): a backward pass that
recomputes a forward segment drawing random numbers (``torch.utils.checkpoint`` with
``preserve_rng_state=False`` around a dropout) leaves the user's random streams as they were.
"""

import contextlib
import time
import warnings

import torch

from cockpit_lite.engine import transforms as _transforms
from cockpit_lite.engine.per_sample import PerSample
from cockpit_lite.engine.rules.base import quiet_batching_fallback
from cockpit_lite.utils.grads import dense

CHUNK_ELEMENTS = 1 << 22
"""Individual-gradient elements per chunk of samples (16 MiB in float32)."""


class Mode:
    """Which way ``individual_gradients`` computes (``"vmap"`` or ``"loop"``), decided once."""

    CALIBRATION_SAMPLES = 4

    def __init__(self):
        self.choice = None


def individual_gradients(contributions, params, mode=None):
    """Yield ``(samples, grads)``: a ``slice`` of consecutive samples and, per parameter,
    their contributions ``∇_θ c_n`` of shape ``[len(samples), *θ.shape]``.

    A parameter that does not take part in the loss gets zeros. ``mode``: a ``Mode``
    kept across steps (``None``: vectorised).
    """
    batch_size = contributions.shape[0]
    size = sum(p.numel() for p in params)
    chunk = max(1, min(batch_size, CHUNK_ELEMENTS // max(size, 1)))
    eye = torch.eye(batch_size, dtype=contributions.dtype, device=contributions.device)
    start = 0
    if mode is not None and mode.choice is None:
        first = slice(0, min(Mode.CALIBRATION_SAMPLES, batch_size))
        began = time.perf_counter()
        grads = _vmap(contributions, params, eye[first])
        vectorised = time.perf_counter() - began if grads is not None else float("inf")
        began = time.perf_counter()
        looped = _loop(contributions, params, first)
        mode.choice = "vmap" if vectorised < time.perf_counter() - began else "loop"
        start = first.stop
        yield first, _complete(looped, params, first)
    for start in range(start, batch_size, chunk):
        samples = slice(start, min(start + chunk, batch_size))
        grads = None
        if mode is None or mode.choice == "vmap":
            grads = _vmap(contributions, params, eye[samples])
        if grads is None:
            grads = _loop(contributions, params, samples)
        yield samples, _complete(grads, params, samples)


@contextlib.contextmanager
def forked_random_state(tensors):
    """Run with the global random state of the CPU and of the GPUs of ``tensors`` forked: what
    runs inside draws from the state as it was, and it is restored on exit."""
    with torch.random.fork_rng(devices=sorted({t.device.index for t in tensors if t.device.type == "cuda"})):
        yield


REENTRANT_FIX = "checkpoint with use_reentrant=False (PyTorch's recommended mode; same memory savings)"


def reentrant_checkpoint(tensor):
    """Whether ``tensor``'s graph runs through a reentrant ``torch.utils.checkpoint`` segment (whose
    parameters no ``torch.autograd.grad`` of the graph reaches)."""
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        if type(node).__name__ == "CheckpointFunctionBackward":
            return True
        seen.add(node)
        stack.extend(child for child, _ in node.next_functions)
    return False


KEPT_BUFFER_ELEMENTS = 1 << 16
"""Buffers of at most this many elements are copied before the Cockpit's own passes (``kept_buffers``)."""


@contextlib.contextmanager
def kept_buffers(model):
    """Run with ``model``'s buffers put back afterwards where what ran inside changed them.

    A backward pass recomputes a checkpointed segment's forward (``torch.utils.checkpoint``), and a
    BatchNorm in training mode there updates its running statistics again: the Cockpit's own passes
    before the user's backward (Hessian-vector products, the GGN's passes, the global path) would
    change the model's state. Buffers of at most ``KEPT_BUFFER_ELEMENTS`` elements (running
    statistics, counters) are copied and put back where their values changed (compared: a recomputed
    BatchNorm's in-place update of its running statistics does not always advance their version
    counter), through ``.data``, which leaves the version counter as the forward pass saved it (the
    BatchNorm's backward checks it); a larger one whose version changed (none of torch's layers
    updates one) is named in a warning.
    """
    if model is None:
        yield
        return
    saved = [(name, b, b._version, b.clone() if b.numel() <= KEPT_BUFFER_ELEMENTS else None)
             for name, b in model.named_buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for name, buffer, version, copy in saved:
                if copy is not None:
                    if not torch.equal(buffer, copy):
                        buffer.data.copy_(copy)
                elif buffer._version != version:
                    warnings.warn(f"cockpit-lite: its own backward passes changed the buffer {name} of the model "
                                  "(a module recomputed in backward updating its state), which is too large to "
                                  "put back: the model's state differs from a run without the Cockpit", stacklevel=4)


def serve(state, info, indices, tracked, names, mode):
    """Serve the tracked parameters ``indices`` (of ``tracked``, named ``names``) by the global path at the
    step ``state`` (``cockpit_lite.engine.step.Step``): their individual gradients, as ``individual_gradients``
    forms them (``mode``: its ``Mode``), go through the step's transforms (or wait for the step's gradient,
    deferred), and the total they sum to is kept for the check."""
    contributions = state.pseudo if state.pseudo is not None else info.contributions(", ".join(state.needed_by))
    if state.batch_size is None:
        state.batch_size = contributions.shape[0]
    elif contributions.shape[0] != state.batch_size:
        raise ValueError(
            f"the loss has {contributions.shape[0]} samples but the forward pass had "
            f"{state.batch_size}; pass info['batch_size']"
        )
    params = [tracked[i] for i in indices]
    with forked_random_state(params), torch.enable_grad():  # a recomputed segment's draws
        totals = torch.autograd.grad(contributions.sum(), params, retain_graph=True, allow_unused=True)
    if any(g is None for g in totals) and reentrant_checkpoint(contributions):
        hidden = [names[i] for i, g in zip(indices, totals) if g is None]
        raise ValueError(
            f"the loss runs through torch.utils.checkpoint(..., use_reentrant=True), whose segment hides the "
            f"parameters inside it ({', '.join(hidden[:5])}{', ...' if len(hidden) > 5 else ''}) from every "
            f"backward pass but the user's own, so their individual gradients cannot be formed. Fix: {REENTRANT_FIX}"
        )
    reached = [j for j, g in enumerate(totals) if g is not None]  # the others (an unused head) have zeros
    totals = [torch.zeros_like(p) if g is None else dense(g.detach()) for g, p in zip(totals, params)]
    parts = {indices[j]: [] for j in reached}
    if state.subset is not None:  # the subsample's vector-Jacobian products only
        contributions = contributions[state.subset.to(contributions.device)]
    for _, grads in individual_gradients(contributions, [params[j] for j in reached], mode) if reached else ():
        with torch.no_grad():
            for j, grad_batch in zip(reached, grads):
                index = indices[j]
                if state.subset is None:  # a second sum of the same gradient (``cockpit_lite.engine.check``: noise)
                    part = grad_batch.sum(0).reshape(-1)
                    state.resummed[index] = part if index not in state.resummed else state.resummed[index] + part
                per_sample = PerSample(
                    tracked[index], index, grad_batch=grad_batch, batch_size=state.batch_size,
                    grad_before=state.grads_before[index],
                )
                per_sample.grad = totals[j].reshape(-1)
                parts[index].append(grad_batch if state.deferred else _transforms.run(state.transforms, per_sample))
    for index, total in zip(indices, totals):
        chunks = parts.get(index)
        whole = None
        if chunks is None:  # not reached: zeros, without a backward pass through the graph per sample
            whole = PerSample.zeros(tracked[index], index, contributions.shape[0], batch_size=state.batch_size,
                                    grad_before=state.grads_before[index])
        elif state.deferred:
            whole = PerSample(tracked[index], index, grad_batch=torch.cat(chunks), batch_size=state.batch_size,
                              grad_before=state.grads_before[index])
        if state.deferred:  # the transforms wait for the step's gradient (DDP, accumulation)
            state.ready(index, whole)
            if not state.distributed:  # checked: was info["loss"] what ran backward?
                state.served[index] = total.reshape(-1)
                state.global_path.add(index)
            continue
        state.results[index] = (_transforms.run(state.transforms, whole) if chunks is None else
                                {t.key: t.combine([chunk[t.key] for chunk in chunks]) for t in state.transforms})
        state.served[index] = total.reshape(-1)  # checked too: was info["loss"] what ran backward?
        state.global_path.add(index)


def _vmap(contributions, params, grad_outputs):
    """The batched VJPs, or ``None`` for an operation vmap cannot batch."""
    with quiet_batching_fallback(), forked_random_state(params):
        try:
            return torch.autograd.grad(
                contributions, params, grad_outputs=grad_outputs,
                is_grads_batched=True, retain_graph=True, allow_unused=True,
            )
        except RuntimeError:
            return None


def _complete(grads, params, samples):
    return [
        torch.zeros((samples.stop - samples.start, *p.shape), dtype=p.dtype, device=p.device) if g is None else dense(g.detach())
        for g, p in zip(grads, params)
    ]


def _loop(contributions, params, samples):
    with forked_random_state(params):
        parts = [
            torch.autograd.grad(contributions[n], params, retain_graph=True, allow_unused=True)
            for n in range(samples.start, samples.stop)
        ]
    return [
        None if all(part[i] is None for part in parts)
        else torch.stack([torch.zeros_like(p) if part[i] is None else part[i] for part in parts])
        for i, p in enumerate(params)
    ]
