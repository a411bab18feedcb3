"""The set-up every check works on: the user's objects, read only, and copies to work on.

``Problem`` holds the user's model, loss, batch and options and never changes
them. Every check asks it for a deep copy of the model (``copy``) in the mode the
check needs, for perturbed inputs, for the tensor to differentiate with respect
to (the inputs, or the output of the input embedding for integer tokens) and for
a fresh optimizer on the copy.

Conventions: the batch axis is axis 0 of the inputs, the targets and the model's
output; the sequence axis (when there is one) is ``sequence_dim`` of the inputs and
of the output; the class axis of the output is axis 1 for classification and the
last axis for ``causal_lm``.
"""

import functools

import torch
from torch import nn

from .isolation import fresh_optimizer, model_copy
from .report import CheckResult
from .splits import KEYS

TASKS = ("classification", "regression", "causal_lm")

#: Layers that mix the samples of a batch by design in train mode (batch statistics).
BATCH_MIXING = (nn.modules.batchnorm._BatchNorm,)
#: Layers whose train-mode output is random.
DROPOUT = (nn.modules.dropout._DropoutNd,)


class Problem:
    """The user's set-up for ``checks.run`` (see there for the arguments)."""

    def __init__(self, model, loss_fn, batch, task="classification", num_classes=None, data=None,
                 sequence_dim=None, optimizer=None):
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
        x, y = batch
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError("batch must be a pair of tensors (x, y)")
        unknown = sorted(set(data or {}) - set(KEYS))
        if unknown:
            raise KeyError(f"unknown data keys {unknown}; use {', '.join(KEYS)}")
        self.model, self.loss_fn, self.x, self.y = model, loss_fn, x, y
        self.task = task
        self.num_classes = num_classes
        self.data = data
        self.sequence_dim = 1 if task == "causal_lm" and sequence_dim is None else sequence_dim
        self.optimizer = optimizer
        self.tokens = not (torch.is_floating_point(x) or torch.is_complex(x))

    @property
    def batch_size(self):
        return self.x.shape[0]

    @property
    def classification(self):
        return self.task in ("classification", "causal_lm")

    @property
    def class_axis(self):
        return -1 if self.task == "causal_lm" else 1

    def classes(self, output):
        """The number of classes: ``num_classes``, or the size of the output's class axis."""
        return self.num_classes or output.shape[self.class_axis]

    def initial_classes(self, name, regression_reason):
        """``(classes, None)`` of the initial predictions, or ``(None, skipped result)`` for a
        regression or fewer than 2 classes (checks of the initial class predictions)."""
        if not self.classification:
            return None, CheckResult.skip(name, regression_reason)
        classes = self.classes(self.initial_output)
        if classes < 2:
            return None, CheckResult.skip(name, f"needs at least 2 classes (got {classes})")
        return classes, None

    def small_batch(self, n):
        """The first ``n`` samples of the batch."""
        return self.x[:n], self.y[:n]

    # ------------------------------------------------------------------ copies

    def copy(self, *, mixing="train", dropout=True, dtype=None):
        """A deep copy of the model in train mode, gradients cleared; returns ``(copy, notes)``.
        Its embeddings give dense gradients (``sparse=False``: the same values, in the layout the
        checks' reductions and optimizers take).

        Args:
            mixing: ``"eval"`` puts the layers that mix samples by design (BatchNorm) in
                eval mode, so that they use their running statistics.
            dropout: False switches dropout off (Dropout modules in eval mode, attention
                dropout 0), for checks that need a deterministic function.
            dtype: convert the copy's floating parameters and buffers (e.g. float64).
        """
        model = model_copy(self.model)
        notes = []
        for m in model.modules():  # the same values as a dense gradient, which every check (and Adam) can read
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse:
                m.sparse = False
        if mixing == "eval":
            mixers = [m for m in model.modules() if isinstance(m, BATCH_MIXING)]
            for m in mixers:
                m.eval()
            if mixers:
                kinds = sorted({type(m).__name__ for m in mixers})
                notes.append(f"{'/'.join(kinds)} ({len(mixers)}) in eval mode: they mix samples by design in train mode")
        if not dropout:
            for m in model.modules():
                if isinstance(m, DROPOUT):
                    m.eval()
                elif isinstance(m, nn.MultiheadAttention):
                    m.dropout = 0.0
        if dtype is not None:
            model.to(dtype)
        return model, notes

    def trainable(self, twin):
        """``(name, parameter)`` of the copy's parameters that training would update.

        With an ``optimizer``: the parameters it holds (frozen ones included, since they
        are there to be trained); without: every parameter of the model.
        """
        named = list(twin.named_parameters())
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            return named
        held = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        names = {name for name, p in self.model.named_parameters() if id(p) in held}
        return [(name, p) for name, p in named if name in names]

    def make_optimizer(self, params, lr):
        """A fresh optimizer on ``params``: Adam at ``lr``, or like ``optimizer=`` (see ``fresh_optimizer``)."""
        return fresh_optimizer(self.optimizer, params, lambda ps: torch.optim.Adam(ps, lr=lr))

    # ------------------------------------------------------------------ inputs

    @functools.cached_property
    def embedding_name(self):
        """Name of the ``nn.Embedding`` that consumes the integer inputs (None if there is none)."""
        if not self.tokens:
            return None
        model, _ = self.copy()
        found = []

        def hook(name, module, inputs, output):
            if not found and inputs and inputs[0].shape == self.x.shape and torch.equal(inputs[0], self.x):
                found.append(name)

        handles = [m.register_forward_hook(functools.partial(hook, name))
                   for name, m in model.named_modules() if isinstance(m, nn.Embedding)]
        try:
            with torch.no_grad():
                model(self.x)
        finally:
            for h in handles:
                h.remove()
        return found[0] if found else None

    @functools.cached_property
    def vocabulary(self):
        """Number of distinct token ids the input accepts."""
        if self.embedding_name is not None:
            return dict(self.model.named_modules())[self.embedding_name].num_embeddings
        return int(self.x.max()) + 1

    def where_differentiated(self):
        """In words: the tensor the backward checks differentiate with respect to."""
        if not self.tokens:
            return "the inputs"
        return f"the output of the input embedding `{self.embedding_name}`"

    def forward_with_leaf(self, model, x):
        """``(output, leaf)``: ``model(x)`` and the tensor to differentiate with respect to.

        Floating inputs: a copy of ``x`` that requires grad. Integer tokens: the output of
        the input embedding, made a leaf by a forward hook, the same leaf for every call of the
        embedding on the tokens (None if no embedding consumes the tokens).
        """
        if not self.tokens:
            leaf = x.detach().clone().requires_grad_(True)
            return model(leaf), leaf
        if self.embedding_name is None:
            return model(x), None
        leaves = []

        def hook(module, inputs, output):  # (every call on the tokens: a second use reaches the leaf too)
            if inputs[0].shape != x.shape or not torch.equal(inputs[0], x):
                return None
            if not leaves:
                leaves.append(output.detach().requires_grad_(True))
            return leaves[0]

        handle = dict(model.named_modules())[self.embedding_name].register_forward_hook(hook)
        try:
            output = model(x)
        finally:
            handle.remove()
        return output, leaves[0]

    def perturbed(self, x, index):
        """A copy of ``x`` whose entries at ``index`` are changed (new random tokens, or noise of
        the inputs' scale added)."""
        out = x.clone()
        part = out[index]
        if self.tokens:
            shift = torch.randint(1, max(self.vocabulary, 2), part.shape, device=x.device)
            out[index] = (part + shift) % max(self.vocabulary, 2)
        else:
            scale = x.detach().float().std().clamp_min(1e-3).to(x.dtype) if x.numel() > 1 else 1.0
            out[index] = part + scale * torch.randn_like(part)
        return out

    @functools.cached_property
    def initial_output(self):
        """The output of (a copy of) the model at initialisation on the batch, in train mode."""
        model, _ = self.copy()
        with torch.no_grad():
            return model(self.x)
