"""Curvature from Hessian-vector products, on any twice-differentiable model.

- ``hvp``: Hessian-vector products ``Hv = ∇_θ(gᵀv)`` of the step's loss, from one gradient
  with graph the Cockpit takes before the user's backward pass (which stays plain, so
  training is bit-identical), for the quantities whose ``Needs`` ask for them (``HessMaxEV``,
  Hutchinson's estimator).
- ``hutchinson``: Hutchinson's estimator of the Hessian diagonal and its traces, with
  jackknife standard errors (``HessTrace`` where BackPACK's exact diagonals do not apply;
  the TICs take exact diagonals only).
- ``double_backward``: names the layer and the fix when a Hessian-vector product fails
  on an operator PyTorch cannot differentiate twice (``nn.Hardsigmoid``).
- ``sdpa``: a derivative for the backward pass of PyTorch's CPU flash-attention kernel,
  so that Hessian-vector products run through ``F.scaled_dot_product_attention``.

BackPACK's exact diagonals live in ``cockpit_lite.backend``; the Lanczos eigensolver of
``HessMaxEV`` in ``cockpit_lite.linalg``.
"""
