"""Hessian-vector products of the step's loss, taken before the user's backward pass.

``loss.backward(create_graph=True)`` is not the computation ``loss.backward()`` is: with
gradient mode on, PyTorch differentiates some operators by other formulas (SiLU and
Mish: ``infinitely_differentiable_silu_backward`` and the like instead of their fused
backward kernels), which round differently in the last bit (measured on EfficientNet in
float64: 2.3e-15 in the gradients at step 0), and BatchNorm in training mode amplifies
that into different parameters (2.7e-8 after two steps). So the user's backward stays
plain, and the Cockpit takes the graph of its own: after the forward pass, before the
user's backward (which frees the forward graph),

    g = ∇_θ L = torch.autograd.grad(L, θ, create_graph=True, retain_graph=True),

once per step for every quantity whose ``Needs`` asks for products (``Needs.hvp``); each
product ``Hv = ∇_θ (gᵀv)`` is one more backward pass through g's graph. When all of them
are done the Cockpit drops g and its graph (``release``); the quantities keep only
detached results. ``H`` is the Hessian of the loss as the forward pass computed it
(BatchNorm in training mode: through the batch statistics; tied weights: w.r.t. the
shared tensor). Cost: one backward pass with graph per step at which a quantity asks,
plus one double backward per product.

Under ``torch.distributed`` (DDP, FSDP2) the loss the ranks minimise is the mean of their losses, whose
Hessian is ``H = (1/W) Σ_r H_r``: every rank takes the gradient with graph of its own loss and forms
``H_r v`` for the same ``v``, and one all-reduce per product gives every rank ``Hv`` (the same numbers
on every rank, so that their eigensolvers and estimators stay in step). A model sharded by FSDP2 is
differentiated by its unsharded parameters, gathered once and kept whole while the products run
(``cockpit_lite.sharded.ShardedGroup.own_passes``).

The gradient with graph and each product run under a forked random state (the CPU's
and that of the parameters' GPUs), restored after them: a backward pass that recomputes
a forward segment drawing random numbers (``torch.utils.checkpoint`` with
``preserve_rng_state=False`` around a dropout) leaves the user's random streams as they were.
"""

import torch

from cockpit_lite.utils.grads import dense


class HessianVectorProducts:
    """``v ↦ Hv`` for the mini-batch Hessian ``H = ∇²_θ L`` of one step (``θ`` the tracked parameters).

    Attributes:
        loss: the step's loss ``L`` (a scalar tensor with its forward graph).
        params: the tracked parameters, whole (the vectors' and products' blocks have their shapes).
        tracked: the tracked parameters as the Cockpit holds them (sharded by FSDP2, or ``params``).
        step: the global step.
        model: the step's model, or ``None`` (messages name its layers).
        count: the products computed so far.
    """

    def __init__(self, loss, params, step, model=None, group=None, tracked=None):
        """
        Args:
            loss: the step's loss (this rank's, under ``torch.distributed``).
            params: the tracked parameters as the loss's graph holds them (FSDP2: its unsharded
                parameters, whole on every rank while the products run; ``Group.own_passes``).
            step: the global step.
            model: the step's model, or ``None``.
            group: the ranks (``cockpit_lite.distributed.Group``), or ``None``: each rank forms
                ``H_r v`` of its own loss, and one all-reduce per product gives every rank
                ``Hv = (1/W) Σ_r H_r v``, the Hessian of the mean of the ranks' losses (the loss whose
                gradient DDP and FSDP2 average), equal on every rank.
            tracked: the tracked parameters themselves (default ``params``; FSDP2: the sharded
                ones), the layout a quantity keeps its results of the products in.
        """
        self.loss, self.params, self.step, self.model, self.group = loss, params, step, model, group
        self.tracked = params if tracked is None else tracked
        self.count = 0
        self._grads = None  # g with its graph, for the parameters whose gradient depends on θ

    def _gradient(self):
        """``{index: g_i}`` with graph (computed at the first product, so its errors belong to the quantity)."""
        if self._grads is None:
            loss = self.loss
            if not torch.is_tensor(loss) or not loss.requires_grad:
                raise ValueError(
                    f"step {self.step}: info['loss'] has no autograd graph, so its Hessian-vector products "
                    "cannot be formed. Fix: pass the loss tensor itself (not loss.item() or loss.detach()), "
                    "computed with gradients enabled"
                )
            trainable = [i for i, p in enumerate(self.params) if p.requires_grad]
            with self._forked_random_state(), torch.enable_grad():
                grads = torch.autograd.grad(
                    loss, [self.params[i] for i in trainable], create_graph=True, retain_graph=True, allow_unused=True
                )
            # a gradient without a graph (None: θ_i unused; else L linear in θ_i alone) is constant: no curvature
            self._grads = {i: dense(g) for i, g in zip(trainable, grads) if g is not None and g.grad_fn is not None}
        return self._grads

    def hvp(self, vectors):
        """``Hv``, per parameter.

        Args:
            vectors: per tracked parameter, a tensor shaped like it (the blocks of ``v``).

        Returns:
            Per parameter, the block of ``Hv`` (detached; zeros for a parameter outside
            the gradient's graph).
        """
        grads = self._gradient()
        self.count += 1
        products = [torch.zeros_like(p) for p in self.params]
        if grads:
            inputs = [i for i, p in enumerate(self.params) if p.requires_grad]
            with self._forked_random_state(), torch.enable_grad():
                hv = torch.autograd.grad(
                    list(grads.values()), [self.params[i] for i in inputs], [vectors[i] for i in grads],
                    retain_graph=True, allow_unused=True,
                )
            for i, h in zip(inputs, hv):
                if h is not None:
                    products[i] = dense(h.detach())
        return products if self.group is None else self.group.mean(products)

    def _forked_random_state(self):
        """``torch.random.fork_rng`` of the CPU and the parameters' GPUs."""
        return torch.random.fork_rng(devices=sorted({p.device.index for p in self.params if p.device.type == "cuda"}))

    def release(self):
        """Drop the gradient and its graph (after the last product of the step)."""
        self._grads = None
