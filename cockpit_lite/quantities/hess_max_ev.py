"""``HessMaxEV``: the largest eigenvalue of the mini-batch loss Hessian."""

import torch

from cockpit_lite.linalg import lanczos_max_eig
from cockpit_lite.quantities.base import Needs, Output, SingleStepQuantity


class HessMaxEV(SingleStepQuantity):
    """``λ_max(∇²L)``, the largest (algebraic) Hessian eigenvalue w.r.t. the tracked parameters.

    Computed by Lanczos iteration on Hessian-vector products ``Hv = ∇(gᵀv)``
    (double backward through the graph kept by ``create_graph``), converged to a
    relative residual ``rtol``, and warm-started from the previous step's top three
    Ritz vectors mixed with fresh noise from the quantity's own generator (the
    user's random state is never used). Cockpit's power iteration returns the
    eigenvalue of largest *magnitude* instead, which differs when a negative
    eigenvalue dominates.
    """

    def __init__(self, track_schedule=None, verbose=False, rtol=1e-3, maxiter=100, seed=0):
        super().__init__(track_schedule, verbose)
        self.rtol, self.maxiter, self.seed = rtol, maxiter, seed
        self._previous = None
        self._generator = None
        self.last_iterations = None

    def create_graph(self, step):
        return self.is_due(step)

    def _needs(self, step, info):
        return Needs()

    def compute(self, step, data):
        params = data.params
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        shapes = [p.shape for p in params]
        sizes = [p.numel() for p in params]

        def hvp(vector):
            pieces = [v.reshape(s) for v, s in zip(vector.split(sizes), shapes)]
            hv = torch.autograd.grad(grads, params, pieces, retain_graph=True, allow_unused=True)
            return torch.cat([
                (h if h is not None else torch.zeros_like(p)).reshape(-1)
                for h, p in zip(hv, params)
            ]).detach()

        start = self._noise(params)
        if self._previous is not None:
            start = self._previous.sum(0) / self._previous.shape[0] ** 0.5 + 0.3 * start
        value, vectors, iterations = lanczos_max_eig(hvp, start, self.rtol, self.maxiter)
        if torch.isfinite(value):
            self._previous = vectors
        self.last_iterations = iterations
        return Output(value)

    def _noise(self, params):
        reference = params[0]
        if self._generator is None:
            self._generator = torch.Generator(device=reference.device).manual_seed(self.seed)
        size = sum(p.numel() for p in params)
        noise = torch.randn(size, generator=self._generator, device=reference.device, dtype=reference.dtype)
        return noise / noise.norm()
