"""Predict the update an optimizer is about to make, one parameter at a time.

``Alpha`` projects the individual gradients at θ_t onto the update ``d_t = θ_{t+1} − θ_t``
inside the backward pass at step t, before ``optimizer.step()`` has run. The update
of one parameter is predicted from that parameter's gradient alone by stepping a
private copy: a fresh optimizer of the same class and hyperparameters, over a clone
of the parameter, with a copy of its state. This works for every element-wise
optimizer in ``torch.optim`` (SGD with momentum, Nesterov and weight decay, Adam,
AdamW, RMSprop, Adagrad, ...) and never touches the real parameters, gradients or
optimizer state. Plain SGD (no momentum, weight decay or ``maximize``), the common
case, takes a shortcut with the same arithmetic as its step, ``θ + (−η) g``.
``Alpha`` checks the prediction against the real update one step later.

Several optimizers that step one model together (Muon for the matrices and AdamW for the
rest; SparseAdam for the embeddings beside Adam) are passed as a list,
``info["optimizer"] = [muon, adamw]``, and seen as one (``Optimizers``).
"""

import collections
import copy
import functools
import inspect
import weakref

import torch

from cockpit_lite.utils.shards import is_sharded


class Optimizers(torch.optim.Optimizer):
    """Several optimizers that step one model together, seen as one (``joined``): the parameter
    groups and the state of all of them; a step pre-hook runs before the first of them steps, a
    step post-hook once every one of them has stepped (the update is whole then). It is read,
    never stepped: it holds no parameters of its own (``torch.optim.Optimizer.__init__`` is not
    run), the training loop steps the members."""

    def __init__(self, optimizers):  # (no Optimizer.__init__: the members hold the parameters)
        self.optimizers = tuple(optimizers)
        self.defaults = {}

    @property
    def param_groups(self):
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @property
    def state(self):
        return collections.ChainMap(*(optimizer.state for optimizer in self.optimizers))

    def register_step_pre_hook(self, hook):
        return _Joined(self, hook, pre=True)

    def register_step_post_hook(self, hook):
        return _Joined(self, hook, pre=False)

    def __repr__(self):
        return f"Optimizers({', '.join(type(o).__name__ for o in self.optimizers)})"


class _Joined:
    """A step hook of ``Optimizers``: hooks on each member, and the round of steps since the last
    time it ran (pre: runs at the first member's step of a round; post: once every member stepped)."""

    def __init__(self, joined, hook, pre):
        self.joined, self.hook, self.pre = joined, hook, pre
        self.stepped = set()
        self._handles = []
        for index, optimizer in enumerate(joined.optimizers):
            if pre:
                self._handles.append(optimizer.register_step_pre_hook(
                    lambda _, args, kwargs, index=index: self._before(index, args, kwargs)))
            self._handles.append(optimizer.register_step_post_hook(
                lambda _, args, kwargs, index=index: self._after(index, args, kwargs)))

    def _before(self, index, args, kwargs):
        if not self.stepped:
            return self.hook(self.joined, args, kwargs)
        return None

    def _after(self, index, args, kwargs):
        self.stepped.add(index)
        if len(self.stepped) == len(self.joined.optimizers):
            self.stepped = set()
            if not self.pre:
                self.hook(self.joined, args, kwargs)

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []


_JOINED = weakref.WeakValueDictionary()


def joined(value):
    """``info["optimizer"]`` as one optimizer: a list or tuple of optimizers as their ``Optimizers``
    (the same object for the same members, so that a quantity sees the same optimizer at every
    step); anything else as it is."""
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(o, torch.optim.Optimizer) for o in value):
        return value
    if len(value) == 1:
        return value[0]
    key = tuple(id(o) for o in value)
    found = _JOINED.get(key)
    if found is None:
        found = _JOINED[key] = Optimizers(value)
    return found


def members(optimizer):
    """The optimizers an ``info["optimizer"]`` value stands for (its members, or itself; none for ``None``)."""
    optimizer = joined(optimizer)
    if isinstance(optimizer, Optimizers):
        return list(optimizer.optimizers)
    return [] if optimizer is None else [optimizer]


class UpdatePredictor:
    """Predict ``d = θ_{t+1} − θ_t`` for single parameters of ``optimizer`` (an ``Optimizers``: of
    the member that updates each)."""

    def __init__(self, optimizer):
        self._owner = {
            id(p): (member, group) for member in members(optimizer) for group in member.param_groups for p in group["params"]
        }

    def __call__(self, param, grad):
        """Return the update ``optimizer.step()`` would make to ``param`` given ``grad``.

        Args:
            param: a parameter managed by the optimizer.
            grad: its gradient (any shape with ``param.numel()`` elements; the whole gradient for
                a parameter sharded by FSDP2, a ``DTensor``: then the update is this rank's rows of
                it, a ``DTensor`` of ``param``'s shape, stepped with the optimizer's sharded state).

        Raises:
            ValueError: if the optimizer does not manage ``param``.
        """
        optimizer, group = self._owner.get(id(param), (None, None))
        if group is None:
            raise ValueError(
                f"the optimizer passed in info['optimizer'] does not update a tracked "
                f"parameter of shape {tuple(param.shape)}. Fix: pass every optimizer that steps the "
                f"model (info['optimizer'] = [optimizer_a, optimizer_b])"
            )
        grad = grad.detach().reshape(param.shape).to(param.dtype)
        if is_sharded(param) and not is_sharded(grad):
            from torch.distributed.tensor import distribute_tensor

            grad = distribute_tensor(grad, param.device_mesh, param.placements, src_data_rank=None)  # its own rows
        if _is_plain_sgd_group(optimizer, group):
            with torch.no_grad():
                return _flat(param.detach().add(grad, alpha=-group["lr"]) - param.detach())
        with torch.no_grad():
            clone = param.detach().clone().requires_grad_(True)
            clone.grad = grad.clone()
            hyper = {k: v for k, v in group.items() if k != "params"}
            shadow = type(optimizer)([clone], **_constructor_kwargs(optimizer, hyper))
            state = optimizer.state.get(param)
            if state:  # tensors cloned (a tenth of deepcopy's cost), anything else deep-copied
                shadow.state[clone] = {key: value.clone() if torch.is_tensor(value) else copy.deepcopy(value)
                                       for key, value in state.items()}
        shadow.step()
        return _flat(clone.detach() - param.detach())


def _flat(update):
    """``update.reshape(-1)``; a sharded one (``DTensor``) as it is (its rows on each rank)."""
    return update if is_sharded(update) else update.reshape(-1)


def _is_plain_sgd_group(optimizer, group):
    """SGD whose step is ``θ ← θ − η g`` for this group."""
    return (
        type(optimizer) is torch.optim.SGD
        and group["momentum"] == 0
        and group["weight_decay"] == 0
        and not group.get("maximize", False)
        and not torch.is_tensor(group["lr"])
    )


def _constructor_kwargs(optimizer, hyper):
    """Keep only the hyperparameters the optimizer's constructor accepts."""
    accepted = _accepted_keywords(type(optimizer))
    return hyper if accepted is None else {k: v for k, v in hyper.items() if k in accepted}


@functools.lru_cache(maxsize=None)
def _accepted_keywords(optimizer_class):
    """Keyword names of the constructor (``None``: it takes ``**kwargs``)."""
    parameters = inspect.signature(optimizer_class.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return frozenset(parameters)


def plain_sgd_learning_rate(optimizer, quantity):
    """Return the learning rate of a plain SGD optimizer (no momentum, weight decay, maximize).

    Raises:
        ValueError: for any other optimizer, or several learning rates, naming ``quantity``.
    """
    if not all(_is_plain_sgd_group(optimizer, g) for g in optimizer.param_groups):
        raise ValueError(
            f"{quantity} is defined for plain SGD (torch.optim.SGD without momentum, "
            f"weight decay or maximize); got {type(optimizer).__name__}. "
            f"Leave {quantity} out for this optimizer."
        )
    rates = {float(g["lr"]) for g in optimizer.param_groups}
    if len(rates) != 1:
        raise ValueError(f"{quantity} needs one learning rate for all parameters, got {sorted(rates)}")
    return rates.pop()
