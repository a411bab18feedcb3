"""Re-initialise dead ReLU units (Kaiming) so that they can learn again.

A ReLU unit is dead on ``x`` when its output is zero for every sample (and, for
convolutions, every position): it passes no gradient, so it never recovers by
itself (a too large learning rate or a large negative bias kills units in the
first steps). ``reinit_dead_relus`` finds, for every ``nn.ReLU`` module, the
``nn.Linear`` / ``nn.ConvNd`` whose output it receives directly, and draws that
layer's incoming weights of the dead units anew, ``U(−b, b)`` with
``b = sqrt(6 / fan_in)`` (Kaiming-uniform for ReLU: variance 2 / fan_in), with a
zero bias. Firing is measured on copies (train mode, forked random state), so the
only change to ``model`` is the re-initialised rows; ReLUs fed through other
layers (e.g. BatchNorm, which keeps units alive anyway) or called as
``F.relu`` are not seen.
"""

import math

import torch
from torch import nn

from .isolation import forked_rng, model_copy

PRODUCERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _unit_axis(module, output):
    return output.dim() - 1 if isinstance(module, nn.Linear) else 1


@torch.no_grad()
def _alive(model, x, seed):
    """``{producer name: bool tensor of its units that fire on x}`` for producers feeding an nn.ReLU."""
    twin = model_copy(model)
    names = {module: name for name, module in twin.named_modules()}
    produced, alive = [], {}

    def produce(module, inputs, output):
        produced.append((output, module))

    def fire(module, inputs, output):
        for tensor, producer in reversed(produced):
            if tensor is inputs[0]:
                axis = _unit_axis(producer, output)
                fired = (output > 0).transpose(0, axis).reshape(output.shape[axis], -1).any(1)
                name = names[producer]
                alive[name] = alive[name] | fired if name in alive else fired
                return

    handles = [m.register_forward_hook(produce) for m in twin.modules() if isinstance(m, PRODUCERS)]
    handles += [m.register_forward_hook(fire) for m in twin.modules() if isinstance(m, nn.ReLU)]
    try:
        with forked_rng(x, seed):
            twin(x)
    finally:
        for h in handles:
            h.remove()
    return alive


def reinit_dead_relus(model, x, seed=0):
    """Re-initialise the incoming weights of ReLU units that never fire on ``x``; return how many now fire.

    Args:
        model: the model, changed in place (only the rows of dead units).
        x: a batch of inputs (the more samples, the fewer units look dead by chance).
        seed: seed of the new weights (a private generator; the global random state is untouched).
    """
    modules = dict(model.named_modules())
    dead = {name: ~fired for name, fired in _alive(model, x, seed).items() if not fired.all()}
    with torch.no_grad():
        for name, units in dead.items():
            layer = modules[name]
            weight = layer.weight
            generator = torch.Generator(device=weight.device).manual_seed(seed)
            fan_in = weight[0].numel()
            bound = math.sqrt(6.0 / fan_in)
            rows = weight[units]
            weight[units] = (torch.rand(rows.shape, generator=generator, device=weight.device, dtype=weight.dtype)
                             * 2 - 1) * bound
            if layer.bias is not None:
                layer.bias[units] = 0.0
    after = _alive(model, x, seed)
    return sum(int((units & after[name]).sum()) for name, units in dead.items())
