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
"""

import warnings

import torch

CHUNK_ELEMENTS = 1 << 22
"""Individual-gradient elements per chunk of samples (16 MiB in float32)."""


def individual_gradients(contributions, params):
    """Yield ``(samples, grads)``: a ``slice`` of consecutive samples and, per parameter,
    their contributions ``∇_θ c_n`` of shape ``[len(samples), *θ.shape]``.

    A parameter that does not take part in the loss gets zeros.
    """
    batch_size = contributions.shape[0]
    size = sum(p.numel() for p in params)
    chunk = max(1, min(batch_size, CHUNK_ELEMENTS // max(size, 1)))
    eye = torch.eye(batch_size, dtype=contributions.dtype, device=contributions.device)
    for start in range(0, batch_size, chunk):
        samples = slice(start, min(start + chunk, batch_size))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*batching rule.*")
            try:
                grads = torch.autograd.grad(
                    contributions, params, grad_outputs=eye[samples],
                    is_grads_batched=True, retain_graph=True, allow_unused=True,
                )
            except RuntimeError:  # an operation vmap cannot batch: one sample at a time
                grads = _loop(contributions, params, samples)
        yield samples, [
            torch.zeros((samples.stop - samples.start, *p.shape), dtype=p.dtype, device=p.device) if g is None else g.detach()
            for g, p in zip(grads, params)
        ]


def _loop(contributions, params, samples):
    parts = [
        torch.autograd.grad(contributions[n], params, retain_graph=True, allow_unused=True)
        for n in range(samples.start, samples.stop)
    ]
    return [
        None if all(part[i] is None for part in parts)
        else torch.stack([torch.zeros_like(p) if part[i] is None else part[i] for part in parts])
        for i, p in enumerate(params)
    ]
