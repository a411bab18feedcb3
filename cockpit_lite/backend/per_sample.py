"""The per-sample BackPACK extension: individual gradients reduced during backprop.

``PerSampleTransforms`` is a first-order BackPACK extension. When the backward pass
reaches a module, it computes that module's individual gradients (one parameter at a
time, with BackPACK's ``BatchGrad`` rule for the layer type), runs every due
transform on them (``cockpit_lite.transforms``) and lets them go. Peak extra memory is
therefore ``B ×`` (largest parameter), never ``B ×`` (model).

Layer support is one table, ``INDIVIDUAL_GRADIENTS``: layer type → the rule that
produces its individual gradients (as a ``cockpit_lite.transforms.PerSample``). Most
layers use BackPACK's ``BatchGrad`` rule; a Linear layer's weight keeps its
individual gradients factored (layer inputs and output gradients), so that norms,
dot products and second moments never build the ``[B, out, in]`` tensor. A tracked parameter of a layer that is not in the
table, or of a layer whose individual gradients are meaningless (BatchNorm in
training mode mixes the samples of a batch), raises ``UnsupportedLayerError`` naming
the layer, the quantities that need individual gradients and what still works.
"""

import itertools
import math

import torch
import torch.nn.functional as F
from torch.nn import (
    LSTM,
    RNN,
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    Embedding,
    Linear,
)
from torch.nn.modules.batchnorm import _BatchNorm

from backpack.extensions.backprop_extension import BackpropExtension
from backpack.extensions.firstorder.batch_grad import (
    batchnorm_nd,
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    embedding,
    linear,
    rnn,
)

from cockpit_lite import transforms as _transforms
from cockpit_lite.transforms import PerSample

class BackPACKRule:
    """Individual gradients by BackPACK's ``BatchGrad`` rule for the layer type."""

    def __init__(self, batch_grad):
        self._batch_grad = batch_grad

    def supports(self, name):
        """Whether the rule knows the parameter called ``name``."""
        return hasattr(self._batch_grad, name)

    def per_sample(self, ext, module, g_inp, g_out, name, param, index):
        grad_batch = getattr(self._batch_grad, name)(ext, module, g_inp, g_out, None)
        return PerSample(param, index, grad_batch=grad_batch.detach())


class LinearRule(BackPACKRule):
    """Linear: the weight's individual gradients ``Σ_l δ_l a_lᵀ`` stay factored as ``(a, δ)``."""

    def __init__(self):
        super().__init__(linear.BatchGradLinear())

    def per_sample(self, ext, module, g_inp, g_out, name, param, index):
        if name != "weight":
            return super().per_sample(ext, module, g_inp, g_out, name, param, index)
        inputs, grad_outputs = module.input0.detach(), g_out[0].detach()
        b = inputs.shape[0]
        factors = (inputs.reshape(b, -1, inputs.shape[-1]), grad_outputs.reshape(b, -1, grad_outputs.shape[-1]))
        return PerSample(param, index, factors=factors)


class ConvRule(BackPACKRule):
    """ConvNd: the weight's individual gradients by im2col and one batched contraction.

    ``grad_batch[n] = δ_n U_nᵀ`` per group, with ``U_n`` the input patches
    (``[C_in k / groups, L]``, gathered as one strided slice of the padded input per
    kernel offset, which is 2-3x faster than ``F.unfold`` on the CPU) and ``δ_n`` the
    output gradients (``[C_out / groups, L]``). The input is padded as the layer's
    forward pass pads it, so ``padding="same"`` and non-zero padding modes are right,
    where BackPACK's ``BatchGrad`` (1.7.1) silently returns wrong values.
    """

    def per_sample(self, ext, module, g_inp, g_out, name, param, index):
        if name != "weight":
            return super().per_sample(ext, module, g_inp, g_out, name, param, index)
        inputs, grad_outputs = module.input0.detach(), g_out[0].detach()
        b, groups, positions = inputs.shape[0], module.groups, math.prod(grad_outputs.shape[2:])
        grad_batch = param.new_empty((b, groups, param.shape[0] // groups, param[0].numel()))
        per_sample = math.prod(inputs.shape[1:]) * math.prod(module.kernel_size)
        step = max(1, PATCH_ELEMENTS // per_sample)  # cache-sized pieces of the batch
        for start in range(0, b, step):
            part = slice(start, start + step)
            patches = _patches(module, inputs[part], grad_outputs.shape[2:])
            torch.matmul(
                grad_outputs[part].reshape(-1, groups, grad_batch.shape[2], positions),
                patches.reshape(-1, groups, grad_batch.shape[3], positions).transpose(2, 3),
                out=grad_batch[part],
            )
        return PerSample(param, index, grad_batch=grad_batch.reshape(b, *param.shape))


PATCH_ELEMENTS = 1 << 18
"""Input-patch elements gathered at a time for a convolution's individual gradients (1 MiB)."""


def _patches(module, inputs, out_shape):
    """im2col: ``[B, C_in · Π kernel, L]`` input patches of a convolution, ordered as ``F.unfold``'s."""
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    padded = F.pad(inputs, module._reversed_padding_repeated_twice, mode=mode)
    windows = []
    for offsets in itertools.product(*(range(k) for k in module.kernel_size)):
        index = (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s)
            for o, d, s, n in zip(offsets, module.dilation, module.stride, out_shape)
        )
        windows.append(padded[index])
    stacked = torch.stack(windows, 2)  # [B, C_in, Π kernel, *out_shape]
    return stacked.reshape(inputs.shape[0], -1, math.prod(out_shape))


INDIVIDUAL_GRADIENTS = {
    Linear: LinearRule(),
    Conv1d: ConvRule(conv1d.BatchGradConv1d()),
    Conv2d: ConvRule(conv2d.BatchGradConv2d()),
    Conv3d: ConvRule(conv3d.BatchGradConv3d()),
    ConvTranspose1d: BackPACKRule(conv_transpose1d.BatchGradConvTranspose1d()),
    ConvTranspose2d: BackPACKRule(conv_transpose2d.BatchGradConvTranspose2d()),
    ConvTranspose3d: BackPACKRule(conv_transpose3d.BatchGradConvTranspose3d()),
    BatchNorm1d: BackPACKRule(batchnorm_nd.BatchGradBatchNormNd()),
    BatchNorm2d: BackPACKRule(batchnorm_nd.BatchGradBatchNormNd()),
    BatchNorm3d: BackPACKRule(batchnorm_nd.BatchGradBatchNormNd()),
    RNN: BackPACKRule(rnn.BatchGradRNN()),
    LSTM: BackPACKRule(rnn.BatchGradLSTM()),
    Embedding: BackPACKRule(embedding.BatchGradEmbedding()),
}
"""Layer type → rule producing a parameter's ``PerSample`` by name."""


class UnsupportedLayerError(NotImplementedError):
    """A tracked parameter belongs to a layer whose individual gradients cannot be computed."""


class PerSampleTransforms(BackpropExtension):
    """Compute due transforms of every tracked parameter's individual gradients in backprop.

    Results are written to ``self.results[index][transform.key]`` (``index`` = the
    parameter's position in the Cockpit's list); ``self.batch_size`` is set by the
    first layer reached. Nothing is stored on the parameters.
    """

    def __init__(self, transforms, param_index, names, needed_by):
        """
        Args:
            transforms: the due ``Transform`` objects (distinct keys).
            param_index: ``{id(param): index}`` of the tracked parameters.
            names: parameter names, for error messages.
            needed_by: names of the due quantities that need individual gradients.
        """
        super().__init__(savefield="_cockpit_lite_unused", module_exts={})
        self.transforms = tuple(transforms)
        self.param_index = param_index
        self.names = names
        self.needed_by = tuple(needed_by)
        self.results = {}
        self.batch_size = None

    def expects_backpropagation_quantities(self):
        return False

    def __call__(self, module, g_inp, g_out):
        tracked = [
            (name, param)
            for name, param in module.named_parameters(recurse=False)
            if id(param) in self.param_index and param.requires_grad
        ]
        if not tracked:
            return
        rule = self._rule(module, [name for name, _ in tracked])
        for name, param in tracked:
            index = self.param_index[id(param)]
            per_sample = rule.per_sample(self, module, g_inp, g_out, name, param, index)
            self.results[index] = _transforms.run(self.transforms, per_sample)
            if self.batch_size is None:
                self.batch_size = per_sample.batch_size
            del per_sample

    def _rule(self, module, param_names):
        """Return the individual-gradient rule for ``module`` or raise a helpful error."""
        rule = INDIVIDUAL_GRADIENTS.get(type(module))
        labels = ", ".join(
            self.names[self.param_index[id(getattr(module, n))]] for n in param_names
        )
        if isinstance(module, _BatchNorm) and module.training:
            raise UnsupportedLayerError(
                f"{module} (parameters {labels}) is a BatchNorm layer in training mode: it "
                "mixes the samples of a batch, so individual gradients are undefined. "
                f"Quantities that need them: {', '.join(self.needed_by)}. Fix: put the "
                "BatchNorm layers in eval mode while tracking (module.eval()), replace "
                "them with GroupNorm/LayerNorm-free alternatives, or leave their "
                "parameters out of the Cockpit's parameter list."
            )
        missing = [n for n in param_names if rule is None or not rule.supports(n)]
        if missing:
            supported = ", ".join(sorted(t.__name__ for t in INDIVIDUAL_GRADIENTS))
            raise UnsupportedLayerError(
                f"{type(module).__name__} layer {module} (parameters {labels}) has no "
                "individual-gradient rule in BackPACK, which the quantities "
                f"{', '.join(self.needed_by)} need. Supported layers: {supported} "
                "(RNN/LSTM: one layer, batch_first). Fix: leave this layer's parameters "
                "out of the Cockpit's parameter list (e.g. Cockpit([p for n, p in "
                "model.named_parameters() if ...])), or track only quantities without "
                "individual gradients (Loss, GradNorm, Distance, UpdateSize, HessMaxEV, Time)."
            )
        return rule
