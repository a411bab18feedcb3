"""Saving and loading a run's state: the values ``Cockpit.state_dict`` holds, in plain types.

A state dict holds tensors, Python numbers, strings, ``None`` and lists, tuples and
dicts of them only, so that ``torch.save(state, path)`` and ``torch.load(path,
weights_only=True)`` carry it (nothing in it selects code). ``encode`` turns the
objects a run keeps between steps into such values, ``decode`` turns them back:

- a tracked parameter itself (a quantity that keeps a reference to the live tensor,
  not a copy) becomes ``{"__param__": i}``, its index, and is the new run's ``i``-th
  tracked parameter after loading;
- a ``torch.Generator`` becomes ``{"__generator__": its state (a uint8 tensor),
  "device": type}`` and is a generator with that state again, on the device of the
  first tracked parameter;
- a numpy array becomes ``{"__ndarray__": tensor}`` (a numpy scalar its Python
  number), a ``set`` ``{"__set__": list}``;
- tensors are detached (not copied); after loading they are moved to the devices of
  the tracked parameters: in a list with one tensor per parameter, the ``i``-th to the
  ``i``-th parameter's device, every other to the first parameter's.

Anything else raises ``TypeError`` naming where it is, when the state is saved.
"""

import numbers

import numpy as np
import torch

PARAM, GENERATOR, NDARRAY, SET = "__param__", "__generator__", "__ndarray__", "__set__"


def encode(value, params, where):
    """``value`` in plain types (see the module docstring); ``where`` names it in errors."""
    if torch.is_tensor(value):
        index = next((i for i, p in enumerate(params) if value is p), None)
        return {PARAM: index} if index is not None else value.detach()
    if isinstance(value, torch.Generator):
        return {GENERATOR: value.get_state(), "device": value.device.type}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"{where}: a numpy array of Python objects cannot be saved")
        return {NDARRAY: torch.from_numpy(value.copy())}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, str, numbers.Number)):
        return value
    if isinstance(value, (set, frozenset)):
        return {SET: [encode(v, params, where) for v in value]}
    if isinstance(value, tuple):
        return tuple(encode(v, params, where) for v in value)
    if isinstance(value, list):
        return [encode(v, params, where) for v in value]
    if isinstance(value, dict):
        return {k: encode(v, params, f"{where}[{k!r}]") for k, v in value.items()}
    raise TypeError(
        f"{where} holds a {type(value).__name__}, which a state dict cannot hold (torch.load(weights_only=True) "
        "could not read it back). Keep tensors, numbers, strings, None and lists, tuples, dicts or sets of them"
    )


def decode(value, params):
    """The inverse of ``encode``, for the parameters ``params`` of the run that loads it."""
    device = params[0].device
    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, dict):
        if value.keys() == {PARAM}:
            return params[value[PARAM]]
        if value.keys() == {GENERATOR, "device"}:
            return _generator(value, device)
        if value.keys() == {NDARRAY}:
            return value[NDARRAY].cpu().numpy()
        if value.keys() == {SET}:
            return {decode(v, params) for v in value[SET]}
        return {k: decode(v, params) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(decode(v, params) for v in value)
    if isinstance(value, list):
        if len(value) == len(params) and all(torch.is_tensor(v) for v in value):
            return [v.to(p.device) for v, p in zip(value, params)]
        return [decode(v, params) for v in value]
    return value


def _generator(value, device):
    if device.type != value["device"]:
        raise ValueError(
            f"the state holds a random number generator of a {value['device']} device, but the parameters are on "
            f"{device}: a generator's state does not carry from one device type to another. Fix: resume with the "
            f"model on a {value['device']} device (model.to(...) before creating the Cockpit)"
        )
    generator = torch.Generator(device=device)
    generator.set_state(value[GENERATOR].cpu())
    return generator
