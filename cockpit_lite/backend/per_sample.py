"""The per-sample BackPACK extension: individual gradients reduced during backprop.

``PerSampleTransforms`` is a first-order BackPACK extension. When the backward pass
reaches a module, it computes that module's individual gradients (one parameter at a
time, with BackPACK's ``BatchGrad`` rule for the layer type), runs every due
transform on them (``cockpit_lite.transforms``) and lets them go. Peak extra memory is
therefore ``B ×`` (largest parameter), never ``B ×`` (model).

Layer support is one table, ``INDIVIDUAL_GRADIENTS``: layer type → the rule that
produces its individual gradients. A tracked parameter of a layer that is not in the
table, or of a layer whose individual gradients are meaningless (BatchNorm in
training mode mixes the samples of a batch), raises ``UnsupportedLayerError`` naming
the layer, the quantities that need individual gradients and what still works.
"""

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

INDIVIDUAL_GRADIENTS = {
    Linear: linear.BatchGradLinear(),
    Conv1d: conv1d.BatchGradConv1d(),
    Conv2d: conv2d.BatchGradConv2d(),
    Conv3d: conv3d.BatchGradConv3d(),
    ConvTranspose1d: conv_transpose1d.BatchGradConvTranspose1d(),
    ConvTranspose2d: conv_transpose2d.BatchGradConvTranspose2d(),
    ConvTranspose3d: conv_transpose3d.BatchGradConvTranspose3d(),
    BatchNorm1d: batchnorm_nd.BatchGradBatchNormNd(),
    BatchNorm2d: batchnorm_nd.BatchGradBatchNormNd(),
    BatchNorm3d: batchnorm_nd.BatchGradBatchNormNd(),
    RNN: rnn.BatchGradRNN(),
    LSTM: rnn.BatchGradLSTM(),
    Embedding: embedding.BatchGradEmbedding(),
}
"""Layer type → BackPACK rule with one method per parameter name returning ``grad_batch``."""


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
            grad_batch = getattr(rule, name)(self, module, g_inp, g_out, None)
            index = self.param_index[id(param)]
            self.results[index] = _transforms.run(self.transforms, grad_batch, param, index)
            if self.batch_size is None:
                self.batch_size = grad_batch.shape[0]
            del grad_batch

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
        missing = [n for n in param_names if rule is None or not hasattr(rule, n)]
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
