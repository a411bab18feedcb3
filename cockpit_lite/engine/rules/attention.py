"""``nn.MultiheadAttention`` self-attention: its projections are Linear layers inside the graph.

``F.multi_head_attention_forward`` projects the (sequence-first, ``[T, B, E]``) input with
one matrix product for ``q, k, v`` (``in_proj_weight``; ``in_proj_bias`` added by it or
after it, depending on the input's layout) and
the attention output with ``out_proj`` (one ``addmm``), each on the rows ``t·B + b``. Their
individual gradients are those of Linear layers: the factors are the product's saved
input rows and its output gradient, regrouped per sample. Pre-hooks on the two graph
nodes catch the output gradients during the user's backward pass, so the attention is
never re-run (dropout inside it is no obstacle).

``plan`` finds the nodes from the parameters' ``AccumulateGrad`` nodes before the
backward pass and returns ``None`` for any other graph shape (cross-attention with
separate projections, ``q/k/v_proj_weight``, a bias-free layer): the generic rule then
serves the module.
"""

import torch

from cockpit_lite.engine.rules.base import compute_dtype
from cockpit_lite.engine.per_sample import PerSample


def _only_consumer(users, node, kind):
    following = users.get((node, 0), [])
    if len(following) != 1 or type(following[0][0]).__name__ != kind:
        return None
    return following[0][0]


PARAMETERS = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")
"""The parameters the projections' hooks serve; any other (``bias_k``, ``bias_v`` of ``add_bias_kv=True``)
takes the generic rule."""


def plan(users, accumulators, module, batch_size):
    """``{"in": Mm node, "out": Addmm node}`` of a packed self-attention call, or ``None``."""
    parameters = [module.in_proj_weight, module.in_proj_bias, module.out_proj.weight, module.out_proj.bias]
    if any(p is None or id(p) not in accumulators for p in parameters):
        return None
    transpose = _only_consumer(users, accumulators[id(module.in_proj_weight)], "TBackward0")
    project_in = transpose and (
        _only_consumer(users, transpose, "MmBackward0") or _only_consumer(users, transpose, "AddmmBackward0")
    )
    transpose = _only_consumer(users, accumulators[id(module.out_proj.weight)], "TBackward0")
    project_out = transpose and _only_consumer(users, transpose, "AddmmBackward0")
    if project_in is None or project_out is None:
        return None
    rows = _rows(project_in).shape[0]
    if rows % batch_size or _rows(project_out).shape[0] != rows:
        return None
    return {"in": project_in, "out": project_out}


def _rows(node):
    """The input rows a projection node saved: ``x`` of ``mm(x, Wᵀ)``, ``x`` of ``addmm(b, x, Wᵀ)``."""
    return node._saved_self if type(node).__name__ == "MmBackward0" else node._saved_mat1


class AttentionHooks:
    """Pre-hooks on the two projections of one call; ``on_result(name, PerSample, low_precision)``
    per parameter (``low_precision``: the output gradient arrived in float16 or bfloat16)."""

    def __init__(self, nodes, tracked, batch_size, on_result):
        self.batch_size = batch_size
        self.tracked = {name: (param, index) for name, param, index in tracked}
        self.on_result = on_result
        self.handles = [
            nodes["out"].register_prehook(self._hook(nodes["out"], "out_proj.weight", "out_proj.bias")),
            nodes["in"].register_prehook(self._hook(nodes["in"], "in_proj_weight", "in_proj_bias")),
        ]

    def remove(self):
        for handle in self.handles:
            handle.remove()

    def _hook(self, node, weight, bias):
        def hook(grad_outputs):
            delta = grad_outputs[0]
            if delta is None:
                return None
            with torch.no_grad():
                inputs = _rows(node)
                low_precision = delta.dtype in (torch.float16, torch.bfloat16)
                dtype = compute_dtype(inputs, delta)
                a, d = (_per_sample(t.detach().to(dtype), self.batch_size) for t in (inputs, delta))
                if weight in self.tracked:
                    param, index = self.tracked[weight]
                    self.on_result(weight, PerSample(param, index, factors=(a, d)), low_precision)
                if bias in self.tracked:
                    param, index = self.tracked[bias]
                    self.on_result(bias, PerSample(param, index, grad_batch=d.sum(1)), low_precision)
            return None

        return hook


def _per_sample(rows, batch_size):
    """Rows ``t·B + b`` (sequence-first) as ``[B, T, features]``."""
    return rows.reshape(-1, batch_size, rows.shape[-1]).transpose(0, 1)
