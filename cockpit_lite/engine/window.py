"""The individual gradients of the backward passes behind one optimizer step.

Under gradient accumulation the optimizer steps with the gradient of several backward
passes (micro-batches ``m = 1..M`` of ``B_m`` samples, each backpropagating its loss
``L_m``, often ``mean_m / M``). The *effective batch* is their union, ``B = Σ_m B_m``
samples, whose loss is ``L = Σ_m L_m``: sample ``n`` of micro-batch ``m`` contributes
``grad_batch[n] = ∇c_n`` (its share of ``L_m``, hence of ``L``), and, as for one backward
pass (``cockpit_lite.engine.transforms``),

    g̃_n = B · grad_batch[n],        g = Σ_m Σ_{n∈m} grad_batch[n] = mean_n g̃_n,

``g`` being the gradient the optimizer steps with. So nothing about a transform changes:
each micro-batch's ``PerSample`` is a chunk of ``B_m`` of the ``B`` samples (as on the
global path), run once ``g`` and ``B`` are known, its values combined over the chunks
(``Transform.combine``). Under ``torch.distributed`` the same holds with ``g`` DDP's
mean of the ranks' gradients and ``B / W`` the scale (``cockpit_lite.distributed``); one
step without accumulation is a window of one backward pass.

Memory: a window keeps every micro-batch's individual gradients (as the layer rules
form them: a Linear layer's factors, an embedding's rows) until the step completes, as
a single backward pass of the effective batch would hold them at once.
"""

import torch

from cockpit_lite.engine import transforms as _transforms
from cockpit_lite.engine.per_sample import PerSample, Scratch
from cockpit_lite.utils.grads import held


class Window:
    """The pending ``PerSample`` objects of one step's backward passes, until ``g`` is known."""

    def __init__(self, grads_before):
        """
        Args:
            grads_before: per parameter, the gradient held before the window's first
                backward pass (an accumulation begun outside the Cockpit), or ``None``.
        """
        self.grads_before = grads_before
        self.parts = {}  # index -> {pass number: PerSample}
        self.sizes = []  # B_m of every pass
        self.failed = set()
        self.errors = {}  # index -> the error of the transforms on its individual gradients (``complete``)

    @property
    def passes(self):
        return len(self.sizes)

    def add(self, pending, batch_size, failed):
        """One backward pass's individual gradients (``{index: PerSample}``), batch size and failures."""
        number = len(self.sizes)
        self.sizes.append(int(batch_size))
        for index, per_sample in pending.items():
            self.parts.setdefault(index, {})[number] = per_sample
        self.failed |= set(failed)

    def complete(self, params, transforms, group=None, grads_after=None):
        """Run the transforms on the effective batch.

        Args:
            params: the tracked parameters.
            transforms: the step's transforms.
            group: the ``Group`` of a DDP run, or ``None``.
            grads_after: per parameter, the gradient right after the last backward pass
                (before any clipping or unscaling); ``None`` reads ``param.grad`` now.

        Returns:
            ``(results, batch_size, grads, sizes)``: ``results[index][key]`` as the engine
            gives them; ``B`` (global under DDP); ``{index: g}`` (flat); every rank's
            number of samples under DDP, else ``None``.
        """
        indices = sorted(self.parts)
        local = [self._sample_sum(i) for i in indices]
        total = sum(self.sizes)
        sizes = None
        if group is not None:
            summed, sizes = group.sum_and_sizes(local, total)
            grads = [s / group.world for s in summed]
            total, scale = sum(sizes), sum(sizes) / group.world
        else:
            grads, scale = local, total
        results, batch, scratch, out = {}, _transforms.Batch(), Scratch(), {}
        for index, grad in zip(indices, grads):
            param = params[index]
            before = self.grads_before[index] if self.grads_before is not None else None
            if group is not None:  # the optimizer's gradient holds more than this window's (no_sync, see StepData)
                kept = grads_after[index] if grads_after is not None else held(param)
                before = None if kept is None else kept.reshape(-1).to(grad.dtype) - grad
            parts = [self._part(index, number, params) for number in range(self.passes)]
            for part in parts:
                part.grad = grad
                part.batch_size = scale
                part.grad_before = before
            try:
                if len(parts) == 1:
                    results[index] = _transforms.run(transforms, parts[0], batch, scratch)
                else:
                    values = [_transforms.run(transforms, part, scratch=scratch) for part in parts]
                    results[index] = {t.key: t.combine([v[t.key] for v in values]) for t in transforms}
            except Exception as error:
                self.errors[index] = error
            out[index] = grad
        batch.flush()
        self.errors.update((index, error) for index, error in batch.failed if index not in self.errors)
        self.failed |= self.errors.keys()
        self.parts = {}
        return results, total, out, sizes

    def _sample_sum(self, index):
        return sum(part.grad for part in self.parts[index].values())

    def _part(self, index, number, params):
        """Pass ``number``'s chunk of parameter ``index``: zeros if the parameter took no part in it."""
        part = self.parts[index].get(number)
        if part is None:
            part = PerSample.zeros(params[index], index, self.sizes[number])
        return part
