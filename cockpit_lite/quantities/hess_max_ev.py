"""``HessMaxEV``: the largest eigenvalue of the mini-batch loss Hessian."""

import torch

from cockpit_lite.curvature import derivatives, double_backward
from cockpit_lite.linalg import lanczos_max_eig, power_max_eig
from cockpit_lite.quantities.base import Needs, Output, SingleStepQuantity

_HINTS = (
    (
        "donated buffer",
        "the forward pass ran through torch.compile, whose donated buffers forbid the "
        "double backward of Hessian-vector products. Fix: run the forward of the steps "
        "where HessMaxEV is due with the uncompiled module (compiled = torch.compile(model) "
        "shares its parameters; use model(x) on those steps), or set "
        "torch._functorch.config.donated_buffer = False before compiling",
    ),
    (
        "scaled_dot_product",
        "the attention kernel of this forward pass cannot be differentiated twice. Fix: "
        "run the forward of the due steps under torch.nn.attention.sdpa_kernel("
        "torch.nn.attention.SDPBackend.MATH)",
    ),
)


class HessMaxEV(SingleStepQuantity):
    """``λ_max(∇²L)``, the largest (algebraic) Hessian eigenvalue w.r.t. the tracked parameters.

    Computed by block Lanczos iteration on Hessian-vector products ``Hv = ∇(gᵀv)``
    (``cockpit_lite.linalg``; the products are double backward passes through a gradient
    the Cockpit takes before the user's backward pass, ``cockpit_lite.curvature.hvp``, so
    ``loss.backward()`` stays plain and needs no ``create_graph``; ``info["loss"]`` is read),
    converged to a relative residual ``‖Hy − θy‖ ≤ rtol·|θ|`` of the top Ritz pair
    ``(θ, y)``. A cold start (the first step) has ``block`` independent noise vectors; a
    warm start (every later step) one vector, the top three Ritz vectors of the latest step
    with a finite value mixed with fresh noise; all noise comes from the
    quantity's own generator (the user's random state is never used). One cold start alone
    returns the *second* eigenvalue when the top two are close and the start's component
    along the top eigenvector is small: an MLP-Mixer gave 2.39420 against 2.42339 (1.2%
    low) after 23 products. Measured on a small Mixer whose top two eigenvalues are 0.7%
    apart, over 400 seeds: one cold start missed λ_max on 21, two on 2, three on none. A warm
    start has a large component along each of the previous top three eigenvectors, so a swap
    of two of them between steps is followed too: one warm start missed none of 1,680 warm
    steps, for 35–45% fewer products than two (``python -m
    experiments.hess_max_ev_starts``: that Mixer, its close pair kept close by a small
    learning rate, 60 seeds; a tanh MLP near uniform output; other Mixers). Cost per step
    (benchmark MLP 784-64-10, B = 64, 20 SGD steps; median products): 24 with the default
    ``block=2`` (46 when every step had two start vectors), 47 at the cold first step; on the
    benchmark CNN 13 (was 21), 22 at the first step.

    ``H`` is the Hessian of the loss as the forward pass computed it: with BatchNorm in
    training mode, of the batch loss through the batch statistics; with tied weights,
    w.r.t. the shared tensor.
    Attention through ``F.scaled_dot_product_attention`` works on CPU (see
    ``cockpit_lite.curvature.sdpa``). Under ``torch.distributed`` (DDP, FSDP2) ``H`` is the
    Hessian of the mean of the ranks' losses: every product is averaged over the ranks by one
    all-reduce, and every rank runs the same solver, from the same start vectors, on the same
    numbers (``cockpit_lite.curvature.hvp``).

    ``use_power=True`` runs Cockpit's power iteration instead (drop-in
    compatibility): it returns the eigenvalue of largest *magnitude*, which differs
    when a negative eigenvalue dominates, and stops when two Rayleigh quotients agree
    to ``rtol``, which does not bound its error. The record's ``meta`` names the
    solver and the number of Hessian-vector products.
    """

    STATE = ("_previous", "_generator")  # the warm start and the noise generator, saved for resuming

    def __init__(self, track_schedule=None, verbose=False, use_power=False, rtol=1e-3, maxiter=100, seed=0, block=2):
        """
        Args:
            use_power: Cockpit's power iteration instead of Lanczos.
            rtol: relative residual tolerance.
            maxiter: most Hessian-vector products per step.
            seed: seed of the start vectors' generator.
            block: start vectors of block Lanczos at a cold start (1: plain Lanczos; 3 for
                clusters of three or more close top eigenvalues, e.g. many classes near
                uniform output); a warm start is one vector.
        """
        super().__init__(track_schedule, verbose)
        if int(block) != block or block < 1:
            raise ValueError(f"HessMaxEV: block must be a positive integer, got {block!r}")
        self.use_power, self.rtol, self.maxiter, self.seed, self.block = use_power, rtol, maxiter, seed, int(block)
        self._previous = None
        self._generator = None
        self.last_iterations = None
        self._value = None  # λ of the step, from before_backward to compute

    INFO = ("loss",)

    def _needs(self, step, info):
        derivatives.enable()
        return Needs(hvp=True)

    def before_backward(self, step, products):
        """Run the eigensolver on ``products`` (the step's Hessian-vector products); keep λ for ``compute``."""
        params = products.params
        shapes = [p.shape for p in params]
        sizes = [p.numel() for p in params]

        def hvp(vector):
            hv = products.hvp([v.reshape(s) for v, s in zip(vector.split(sizes), shapes)])
            return torch.cat([h.reshape(-1) for h in hv])

        start = self._noise(params)
        try:
            if self.use_power:
                value, _, iterations = power_max_eig(hvp, start.abs(), self.rtol, maxiter=self.maxiter)
            else:
                cold = self._previous is None
                if not cold:
                    start = self._previous.sum(0) / self._previous.shape[0] ** 0.5 + 0.3 * start
                starts = torch.stack([start, *(self._noise(params) for _ in range(self.block - 1 if cold else 0))])
                # the basis allocated for a quarter more products than the previous step took: rarely grown
                expected = 16 if self.last_iterations is None else self.last_iterations * 5 // 4 + 2
                value, vectors, iterations = lanczos_max_eig(hvp, starts, self.rtol, self.maxiter, expected=expected)
                if torch.isfinite(value):
                    self._previous = vectors
        except RuntimeError as error:
            for marker, hint in _HINTS:
                if marker in str(error):
                    raise RuntimeError(f"HessMaxEV at step {step}: {hint} ({error})") from error
            explained = double_backward.explain(error, products.model, products.loss)
            if explained is not None:
                raise RuntimeError(f"HessMaxEV at step {step}: {explained} ({error})") from error
            raise
        self.last_iterations = iterations
        self._value = value

    def compute(self, step, data):
        value, self._value = self._value, None
        return Output(value, meta={"solver": "power" if self.use_power else "lanczos", "products": self.last_iterations})

    def _noise(self, params):
        reference = params[0]
        if self._generator is None:
            self._generator = torch.Generator(device=reference.device).manual_seed(self.seed)
        size = sum(p.numel() for p in params)
        noise = torch.randn(size, generator=self._generator, device=reference.device, dtype=reference.dtype)
        return noise / noise.norm()
