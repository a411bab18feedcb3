"""Individual-gradient rules: layer type → how a call's individual gradients are formed.

A rule turns one ``Call`` of a module (its inputs, and the gradient ``δ`` w.r.t. its
output from the ordinary backward pass) into the individual gradients of the
module's own parameters, one ``cockpit_lite.engine.per_sample.PerSample`` per parameter.
Sample ``n``'s part of ``δ`` is ``∂c_n/∂output`` as long as nothing after the module
mixes the samples of the batch (the engine sends parameters upstream of a BatchNorm
in training mode to the exact global path instead).

``RULES`` maps a layer type (exact type, so that a subclass with its own ``forward``
is never mistaken for its parent) to a fast rule computed inside the backward pass,
right when ``δ`` arrives. Every other module uses ``GENERIC``: the module is re-run
per sample with ``torch.func`` at the end of the backward pass.
"""

import torch
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from cockpit_lite.engine.rules.base import UnsupportedCall
from cockpit_lite.engine.rules.conv import ConvRule
from cockpit_lite.engine.rules.embedding import EmbeddingRule
from cockpit_lite.engine.rules.generic import GenericRule
from cockpit_lite.engine.rules.linear import LinearRule, TransposedLinearRule
from cockpit_lite.engine.rules.norm import BatchNormRule, GroupNormRule, LayerNormRule, RMSNormRule
from cockpit_lite.utils.shards import module_class

__all__ = ["GENERIC", "RULES", "RULES_BY_NAME", "TransposedLinearRule", "UnsupportedCall", "rule_for"]

RULES = {
    nn.Linear: LinearRule(),
    NonDynamicallyQuantizableLinear: LinearRule(),
    nn.Conv1d: ConvRule(),
    nn.Conv2d: ConvRule(),
    nn.Conv3d: ConvRule(),
    nn.Embedding: EmbeddingRule(),
    nn.LayerNorm: LayerNormRule(),
    nn.GroupNorm: GroupNormRule(),
    nn.BatchNorm1d: BatchNormRule(),
    nn.BatchNorm2d: BatchNormRule(),
    nn.BatchNorm3d: BatchNormRule(),
    nn.SyncBatchNorm: BatchNormRule(),
}
if hasattr(nn, "RMSNorm"):  # torch >= 2.4
    RULES[nn.RMSNorm] = RMSNormRule()

RULES_BY_NAME = {
    ("transformers.pytorch_utils", "Conv1D"): TransposedLinearRule(),
}
"""Rules for layer types of optional packages, by ``(module, class name)``: no import needed."""

GENERIC = GenericRule()


def rule_for(module):
    """The rule for ``module``'s own parameters (a module ``fully_shard``-ed by FSDP2: its original class's)."""
    kind = module_class(module)
    rule = RULES.get(kind)
    if rule is None:
        rule = RULES_BY_NAME.get((kind.__module__, kind.__name__), GENERIC)
    return rule


def mixes_samples(call):
    """Whether a call (``capture.Call``) makes each sample's output depend on the others.

    BatchNorm normalises with the statistics of the batch in training mode (and
    always without running statistics); a ``MultiheadAttention`` given an unbatched query
    ``[T, E]`` attends over its first axis, the one read as the samples' (rows of a ``[B, E]``
    batch attending to each other).
    """
    from torch.nn import MultiheadAttention
    from torch.nn.modules.batchnorm import _BatchNorm

    module = call.module
    if isinstance(module, MultiheadAttention):
        query = call.args[0] if call.args else call.kwargs.get("query")
        return getattr(query, "ndim", None) == 2
    return isinstance(module, _BatchNorm) and (module.training or not module.track_running_stats)


del torch
