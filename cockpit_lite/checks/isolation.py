"""Working beside the user's objects, never on them: model copies, a forked random state,
and a loop over the user's batches."""

import contextlib
import copy

import torch


def model_copy(model):
    """A deep copy of ``model`` in train mode with its gradients cleared."""
    twin = copy.deepcopy(model)
    twin.train()
    for p in twin.parameters():
        p.grad = None
    return twin


@contextlib.contextmanager
def forked_rng(x, seed):
    """Fork the global random state (CPU, and ``x``'s GPU), seed it with ``seed``, restore it on exit."""
    devices = [x.device.index or 0] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def batch_list(batches):
    """``batches`` as an iterable of ``(x, y)`` pairs: one pair becomes a list of one."""
    if isinstance(batches, tuple) and len(batches) == 2 and isinstance(batches[0], torch.Tensor):
        return [batches]
    return batches


def endless(batches):
    """Yield ``(x, y)`` from ``batches`` (one pair, a list of pairs or a re-iterable loader) forever."""
    batches = batch_list(batches)
    while True:
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            raise ValueError("batches is empty")


def fresh_optimizer(spec, params, default):
    """A new optimizer on ``params``, never the user's: ``default(params)`` when ``spec`` is None,
    one of the same class and hyper-parameters when ``spec`` is an Optimizer, else ``spec(params)``."""
    if spec is None:
        return default(params)
    if isinstance(spec, torch.optim.Optimizer):
        group = spec.param_groups[0]
        return type(spec)(params, **{k: group[k] for k in spec.defaults if k in group})
    return spec(params)
