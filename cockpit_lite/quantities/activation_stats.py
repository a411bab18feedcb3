"""``ActivationStats``: statistics of every activation module's output, from forward hooks.

For each activation module (``ACTIVATIONS``), over the outputs ``y`` of the training
forward pass of the step (calls with gradients enabled; a module called several times
averages its calls; a call whose output has no entries, such as an expert no sample was
routed to, adds nothing):

- ``mean`` and ``std`` of all entries of ``y`` (``std = ‖y − mean‖ / √n``, centred first: the second
  moment ``⟨y, y⟩ / n − mean²`` cancels when ``|mean| ≫ std``, as for a sigmoid's outputs near 1);
- ``dead`` (ReLU family): fraction of units that never fired in the batch,
  ``1 − mean_u 1[max_n y_{n,u} > 0]``, a unit being one position of ``y[n]`` (a feature,
  or a channel at one pixel; a 1-d output ``y[n]`` is a batch of scalars, one unit);
  NaN for a call of fewer than ``DEAD_MIN_SAMPLES`` samples, where units that are alive
  look dead by chance;
- ``zeros``: fraction of entries exactly 0, over the first ``SUB_BATCH`` samples (of a
  1-d output, over all its entries: a reduction as cheap as the mean's);
- ``saturated`` (tanh / sigmoid family): fraction of entries in the flat tails,
  ``|y| > 0.99`` for tanh (pre-activation ``|x| > 2.65``), ``y < 0.01`` or ``y > 0.99``
  for sigmoid (``|x| > 4.6``), where the derivative is below 2 % of its maximum, over
  the first ``SUB_BATCH`` samples.

Recurrent layers (``nn.LSTM``, ``nn.GRU``) compute their gates inside one kernel, where
no hook reaches: for them ``saturated`` is the fraction of gate values in those tails,
the sigmoid gates (LSTM ``i, f, o``; GRU ``r, z``) and the tanh candidates (LSTM ``g``,
GRU ``n``) of every layer, direction and time step, recomputed from the layer's weights
on the first ``SUB_BATCH`` sequences (``recurrent_gates``: the layer's own recurrence,
without the dropout between layers); ``mean``/``std``/``zeros`` are those of its output
sequence. On a packed sequence they are those of its entries (``PackedSequence.data``, time-major:
the first ``SUB_BATCH`` rows are the first time steps), and ``saturated`` is NaN (not recomputed).

Cost: ``mean``, ``std`` and ``dead`` are reductions over the whole batch (``dead`` needs
every sample: a unit that fires on one sample in 30 is alive); ``std`` centres the output
first, one element-wise pass and a temporary of the output's size (on one CPU thread 0.38 ms
for 5·10⁵ entries, 47 ms for 1.3·10⁷, against 0.15 and 6.4 ms for the uncentred second moment,
whose cancellation it avoids; ``torch.var_mean`` took 3.4 and 82 ms); ``zeros`` and
``saturated`` are fractions of entries, unbiased on a sub-batch, and need an
element-wise comparison (on CPU 5-20x dearer than a reduction), so they read the first
``SUB_BATCH`` samples only. All of it runs only at the steps the quantity records.

Activation modules are ``torch.nn``'s (``ACTIVATIONS``) and any other library's or user's
whose class name says which function it computes (``cockpit_lite.utils.activations``: Hugging
Face's ``GELUActivation``, timm's ``GELU``/``Sigmoid``/``Tanh``, minGPT's ``NewGELU``, a
``ReLUSquaredActivation`` for ``dead``): leaf modules without parameters (a PReLU's slopes
aside), whose calls are watched where the output has the input's shape (elementwise).

The value is ``{module name: {"type": class name, "mean", "std", "zeros", "dead",
"saturated"}}`` in the order the modules ran (``None`` where a statistic does not
apply). The hooks reduce on the device and keep 0-d tensors; they go to the host
with the step's other values. No BackPACK, no ``extend``: works on any model with
activation *modules* (a functional ``F.relu`` is not seen).

Under torch.distributed (DDP, or a model sharded by FSDP2: ``cockpit_lite.sharded``) each rank sees its part
of the batch:
the hooks keep sums instead (entries, their sum and the sum of squared deviations from the part's own
mean in float64, combined over the ranks with the spread of the parts' means; per unit whether
it fired; per sample of the first ``SUB_BATCH`` the zeros and saturated entries), and one
all-gather at ``compute`` combines the ranks' in rank order, so that every statistic is the
global batch's, as in one process (up to the float32 rounding of the one-process reductions;
a recurrent layer's ``saturated`` is the first sequences' of each rank). A module that only some
ranks called (an expert none of a rank's samples was routed to) is the statistics of the ranks
that called it.

Also, in the step's ``meta``: ``input_layer = {"name", "type"}``, the first module that
receives the model's first floating-point input (positional, then keyword) (through shape-only modules such as
``Flatten``, ``Identity``, ``Dropout``, which are skipped), found on the first training
forward pass and then fixed; absent when the input is transformed by a functional op
before any module sees it. The ``unnormalized_inputs`` rule reads it: an input scale
that a first BatchNorm/LayerNorm normalises away is an oddity, not a fault.
"""

import torch
from torch import nn

from cockpit_lite.quantities.base import Needs, Output, Quantity, floating_inputs, input_module, user_forward
from cockpit_lite.distributed import gather_objects
from cockpit_lite.utils import activations
from cockpit_lite.utils.moments import pooled
from cockpit_lite.utils.shards import module_class

RELU = (nn.ReLU, nn.ReLU6)
TANH = (nn.Tanh, nn.Hardtanh, nn.Softsign)
SIGMOID = (nn.Sigmoid, nn.Hardsigmoid)
RECURRENT = (nn.LSTM, nn.GRU)
ACTIVATIONS = RELU + TANH + SIGMOID + RECURRENT + (
    nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU, nn.Hardswish, nn.Softplus, nn.Mish)
"""The ``torch.nn`` module types that are watched."""

SATURATION = 0.99
"""Tanh: ``|y| > SATURATION``; sigmoid: ``y`` within ``1 − SATURATION`` of 0 or 1."""

SUB_BATCH = 16
"""Samples (along the first axis) that ``zeros`` and ``saturated`` are computed on."""

DEAD_MIN_SAMPLES = 8
"""Fewest samples ``dead`` is measured on: a healthy unit that fires on half the samples has
not fired in a batch of n with probability 2⁻ⁿ (50 % of the units at n = 1, 0.4 % at n = 8)."""

PASS_THROUGH = (nn.Flatten, nn.Unflatten, nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
"""Modules that do not change the input's scale: the first layer is the one after them."""

LOOK = 3
"""Training forward passes in which the input layer is looked for (then the hooks are removed)."""


class ActivationStats(Quantity):
    """Per activation module: mean, std, fraction of zeros, of dead units, of saturated entries.

    Saved state (``STATE``): the next step's number, which the forward hooks read, and the
    input layer once found (or how many passes were searched).
    """

    TIER = 0  # (overhead budget: bookkeeping)

    STATE = ("_next", "_first", "_looked")

    def __init__(self, track_schedule=None, verbose=False):
        super().__init__(track_schedule, verbose)
        self._handles = []
        self._watched = []  # (name, module) of the activation modules of the model
        self._sums = {}
        self._next = 0
        self._first = None      # {"name", "type"} of the input layer, once found
        self._finding = []      # handles of the hooks that look for it (removed once found)
        self._carried = []      # the model's input and its pass-through copies in this forward pass
        self._looked = 0        # training forward passes looked at (given up after LOOK)
        self._group = None      # DDP, FSDP2: the ranks whose batches are one (``compute`` combines them)

    def bind(self, cockpit):
        self._group = cockpit.group  # (DDP or FSDP2: each rank sees its part of the batch)

    def watch(self, model):
        self._watched = [(name, module) for name, module in model.named_modules() if activation_kind(module)[0]]
        self._arm(True)
        self._finding.append(input_module(model).register_forward_pre_hook(self._model_input, with_kwargs=True))
        for name, module in model.named_modules():
            if name and not list(module.children()):  # leaves: the modules that compute
                self._finding.append(module.register_forward_pre_hook(self._leaf(name)))
                if isinstance(module, PASS_THROUGH):
                    self._finding.append(module.register_forward_hook(self._carry))

    def unbind(self):
        self._stop_looking()
        self._arm(False)
        self._watched = []
        self._sums = {}

    def _arm(self, on):
        """Hook the activation modules (``on``) or not: only a forward pass whose step is due is
        watched (a step where nothing is recorded runs without these hooks)."""
        if on and not self._handles:
            self._handles = [module.register_forward_hook(self._hook(name, module)) for name, module in self._watched]
        elif not on:
            for handle in self._handles:
                handle.remove()
            self._handles = []

    def _stop_looking(self):
        for handle in self._finding:
            handle.remove()
        self._finding, self._carried = [], []

    def _model_input(self, module, args, kwargs):
        if user_forward() and self._first is None:
            self._looked += 1
            self._carried = floating_inputs(args, kwargs)[:1]

    def _leaf(self, name):
        def hook(module, args):
            if self._first is not None or not self._carried or not args or not torch.is_tensor(args[0]):
                return None
            if isinstance(module, PASS_THROUGH) or not any(args[0] is t for t in self._carried):
                return None
            self._first = {"name": name, "type": module_class(module).__name__}
            self._carried = []
            return None  # the hooks are removed after the pass (never while the module runs them)

        return hook

    def _carry(self, module, args, output):
        if self._carried and args and any(args[0] is t for t in self._carried) and torch.is_tensor(output):
            self._carried.append(output)

    def _hook(self, name, module):
        kind = activation_kind(module)[1]
        named = not isinstance(module, ACTIVATIONS)  # (known by its name: watched where it is elementwise)

        def hook(mod, args, output):
            if not user_forward() or not self.is_due(self._next):
                return None
            if named and not (args and torch.is_tensor(args[0]) and torch.is_tensor(output)
                              and args[0].shape == output.shape):
                return None
            gates = None
            if kind == "recurrent":
                output = output[0]  # (output sequence, final state)
                if isinstance(output, nn.utils.rnn.PackedSequence):
                    output, gates = output.data, float("nan")  # (its entries; the gates are not recomputed)
                elif not args or not torch.is_tensor(args[0]):
                    return None  # (the input passed by keyword: no recomputation)
                else:
                    with torch.no_grad():
                        gates = recurrent_gates(mod, args[0].detach(), _state(args))[1]
            if not torch.is_tensor(output) or not output.is_floating_point() or output.dim() == 0 or not output.numel():
                return None
            with torch.no_grad():
                if self._group is not None:  # this rank's sums, combined at ``compute``
                    self._calls(name, module_class(mod).__name__, kind).append(_partial(output.detach(), kind, gates))
                    return None
                stats = _statistics(output.detach(), kind)
                if gates is not None:
                    stats[4] = gates
                self._add(name, type(mod).__name__, kind, stats)
            return None

        return hook

    def _add(self, name, type_name, kind, stats):
        if name in self._sums:
            _, _, total, count = self._sums[name]
            self._sums[name] = (type_name, kind, total + stats, count + 1)
        else:
            self._sums[name] = (type_name, kind, stats, 1)

    def _calls(self, name, type_name, kind):
        """Several ranks: the list of a module's calls' partial sums (``_partial``) at this step."""
        return self._sums.setdefault(name, (type_name, kind, []))[2]

    def _combined(self, sums):
        """Several ranks: ``sums`` as ``_add`` keeps them, from every rank's partial sums (one all-gather). A
        module some rank did not call (an expert no sample of its batch was routed to) is combined from the
        ranks that did, call ``i`` of each with call ``i`` of the others, in the order of the first rank
        that called it."""
        ranks = gather_objects(sums, self._group.process_group)
        combined = {}
        for rank in ranks:
            for name, (type_name, kind, _) in rank.items():
                if name in combined:
                    continue
                calls = [other[name][2] for other in ranks if name in other]
                stats = [_global_statistics([c[i] for c in calls if i < len(c)], kind)
                         for i in range(max(len(c) for c in calls))]
                combined[name] = (type_name, kind, torch.stack(stats).sum(0), len(stats))  # (host values: left there)
        return combined

    def needs(self, step, info):
        if self._finding and (self._first is not None or self._looked >= LOOK):
            self._stop_looking()  # (at every step: a step far from the next due one pays no hook on each leaf)
        self._next = step + 1
        self._arm(self.is_due(self._next))
        if not self.is_due(step):
            self._sums = {}
            return None
        return Needs()

    def compute(self, step, data):
        sums, self._sums = self._sums, {}
        meta = {"input_layer": dict(self._first)} if self._first is not None else None
        if self._group is not None:
            sums = self._combined(sums)
        if not sums:
            return None
        value = {}
        for name, (type_name, kind, total, count) in sums.items():
            mean = total / count
            value[name] = {
                "type": type_name, "mean": mean[0], "std": mean[1], "zeros": mean[2],
                "dead": mean[3] if kind == "relu" else None,
                "saturated": mean[4] if kind in ("tanh", "sigmoid", "recurrent") else None,
            }
        return Output(value, meta=meta)


def activation_kind(module):
    """``(watched, kind)``: whether ``module`` is an activation module, and its statistic beyond mean, std
    and zeros (``"relu"``: dead; ``"tanh"``, ``"sigmoid"``: saturated; ``"recurrent"``: its gates
    saturated; ``None``: none). ``torch.nn``'s by type, others by ``cockpit_lite.utils.activations``."""
    for types, kind in ((RELU, "relu"), (TANH, "tanh"), (SIGMOID, "sigmoid"), (RECURRENT, "recurrent")):
        if isinstance(module, types):
            return True, kind
    if isinstance(module, ACTIVATIONS):
        return True, None
    name = type(module).__name__
    found = activations.family(name)
    if found is None or next(module.children(), None) is not None:
        return False, None
    if next(module.parameters(), None) is not None and "prelu" not in name.lower():  # (a layer with weights)
        return False, None
    return True, found.kind


def _statistics(y, kind):
    """``[mean, std, zeros, dead, saturated]`` of ``y`` as one tensor (0 where one does not apply)."""
    y32 = y.float()
    flat = y32.reshape(-1)
    zero = y32.new_zeros(())
    mean = flat.mean()  # (torch.std_mean is several times slower on a CPU)
    std = torch.linalg.vector_norm(flat - mean) / flat.numel() ** 0.5
    sub = y32[:SUB_BATCH] if y32.dim() > 1 else y32
    zeros = (sub == 0).float().mean()
    dead = saturated = zero
    if kind == "relu" and y32.shape[0] < DEAD_MIN_SAMPLES:
        dead = torch.full((), float("nan"), device=y32.device)
    elif kind == "relu":  # the hook skips 0-d outputs
        dead = 1.0 - (y32.amax(0) > 0).float().mean()
    elif kind == "tanh":
        saturated = (sub.abs() > SATURATION).float().mean()
    elif kind == "sigmoid":
        saturated = ((sub - 0.5).abs() > SATURATION - 0.5).float().mean()
    return torch.stack([mean, std, zeros, dead, saturated])


def _partial(y, kind, gates=None):
    """Several ranks: what one rank's part of a call adds to ``_statistics``: ``[[entries, Σy, Σ(y − ȳ)²], [samples],
    fired per unit (ReLU), zeros per sample, saturated per sample]`` (float64; per sample of the
    first ``SUB_BATCH``; of a 1-d output, every entry its own sample), a recurrent layer's
    ``saturated`` from its gates as ``[fraction]``."""
    y64 = y.double()
    flat = y64.reshape(-1)
    total = flat.sum()
    centred = flat - total / flat.numel()
    sums = torch.stack([flat.new_tensor(float(flat.numel())), total, torch.dot(centred, centred)])
    sub = y64[:SUB_BATCH].reshape(min(len(y64), SUB_BATCH), -1) if y64.dim() > 1 else y64.reshape(-1, 1)
    fired = (y64.amax(0) > 0).double().reshape(-1) if kind == "relu" else flat.new_zeros(0)
    if kind == "tanh":
        saturated = (sub.abs() > SATURATION).double().sum(1)
    elif kind == "sigmoid":
        saturated = ((sub - 0.5).abs() > SATURATION - 0.5).double().sum(1)
    else:
        saturated = flat.new_tensor([float("nan") if gates is None else float(gates)])
    return [sums, flat.new_tensor([float(y64.shape[0]), float(y64.dim() > 1)]), fired, (sub == 0).double().sum(1),
            saturated]


def _global_statistics(parts, kind):
    """``_statistics`` of one call over all ranks' samples, from their ``_partial`` sums in rank order."""
    sums = torch.stack([part[0] for part in parts])  # [entries, Σy, Σ(y − ȳ_part)²] of each part
    samples = sum(float(part[1][0]) for part in parts)
    batched = bool(parts[0][1][1])  # (a 1-d output: every entry counts, each its own sample)
    entries = sums[:, 0].sum()
    mean, deviations = pooled(sums[:, 0], sums[:, 1], sums[:, 2])
    std = (deviations / entries).sqrt()
    width = entries / samples if batched else 1.0  # entries per sample
    zeros = torch.cat([part[3] for part in parts])[:SUB_BATCH if batched else None]
    first = len(zeros)
    zeros = zeros.sum() / (first * width)
    dead = saturated = mean.new_tensor(0.0)
    if kind == "relu":
        dead = mean.new_tensor(float("nan")) if samples < DEAD_MIN_SAMPLES else (
            1.0 - (torch.stack([part[2] for part in parts]).amax(0) > 0).double().mean())
    elif kind in ("tanh", "sigmoid"):
        saturated = torch.cat([part[4] for part in parts])[:SUB_BATCH if batched else None].sum() / (first * width)
    elif kind == "recurrent":
        saturated = parts[0][4][0]
    return torch.stack([mean, std, zeros, dead, saturated]).float()


def _state(args):
    """The initial state a recurrent layer was called with (``h0`` or ``(h0, c0)``), or ``None``."""
    state = args[1] if len(args) > 1 else None
    return tuple(t.detach() for t in state) if isinstance(state, tuple) else (
        state.detach() if torch.is_tensor(state) else None)


def _tails(values, kind):
    """How many entries of ``values`` lie in the flat tails of a sigmoid or a tanh."""
    return ((values - 0.5).abs() > SATURATION - 0.5).sum() if kind == "sigmoid" else (values.abs() > SATURATION).sum()


def recurrent_gates(module, inputs, state=None):
    """``(output, saturated)``: an ``nn.LSTM``/``nn.GRU``'s recurrence recomputed from its weights.

    On the first ``SUB_BATCH`` sequences of ``inputs`` (in the module's layout), in float32,
    layer by layer and direction by direction. LSTM: ``[i, f, g, o] = W_ih x_t + b_ih +
    W_hh h_{t−1} + b_hh``, ``i, f, o`` through a sigmoid and ``g`` through a tanh,
    ``c_t = f c_{t−1} + i g``, ``h_t = o tanh(c_t)`` (times ``W_hr`` with ``proj_size``). GRU:
    ``r, z = σ(W_i x_t + b_i + W_h h_{t−1} + b_h)`` for their rows, ``n = tanh(W_in x_t + b_in
    + r (W_hn h_{t−1} + b_hn))``, ``h_t = (1 − z) n + z h_{t−1}``. ``saturated`` is the fraction
    of all gate values in the flat tails (``SATURATION``); ``output`` is the last layer's
    sequence (batch first), which equals the module's own output without dropout.
    """
    lstm = isinstance(module, nn.LSTM)
    x = inputs.float()
    if x.dim() == 2:  # one unbatched sequence [T, features]
        x = x.unsqueeze(0)
        state = tuple(s.unsqueeze(1) for s in state) if isinstance(state, tuple) else (
            state.unsqueeze(1) if state is not None else None)
    elif not module.batch_first:
        x = x.transpose(0, 1)
    x = x[:SUB_BATCH]
    if state is not None:
        state = tuple(s[:, :SUB_BATCH].float() for s in state) if lstm else state[:, :SUB_BATCH].float()
    directions = 2 if module.bidirectional else 1
    real = getattr(module, "proj_size", 0) or module.hidden_size
    tails, count = x.new_zeros(()), 0
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            w = {k: getattr(module, k + suffix).float() for k in ("weight_ih", "weight_hh")}
            b = {k: (getattr(module, k + suffix).float() if module.bias else 0.0) for k in ("bias_ih", "bias_hh")}
            index = layer * directions + direction
            seq = x.flip(1) if direction else x
            if lstm:
                h = state[0][index] if state is not None else x.new_zeros(x.shape[0], real)
                c = state[1][index] if state is not None else x.new_zeros(x.shape[0], module.hidden_size)
            else:
                h = state[index] if state is not None else x.new_zeros(x.shape[0], module.hidden_size)
            projected = seq @ w["weight_ih"].T + b["bias_ih"]
            hs = []
            for t in range(seq.shape[1]):
                recurrent = h @ w["weight_hh"].T + b["bias_hh"]
                if lstm:
                    i, f, g, o = (projected[:, t] + recurrent).chunk(4, -1)
                    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
                    tails = tails + _tails(torch.cat([i, f, o], -1), "sigmoid") + _tails(g, "tanh")
                    c = f * c + i * g
                    h = o * c.tanh()
                    if getattr(module, "proj_size", 0):
                        h = h @ getattr(module, "weight_hr" + suffix).float().T
                    count += 4 * i.numel()
                else:
                    xr, xz, xn = projected[:, t].chunk(3, -1)
                    hr, hz, hn = recurrent.chunk(3, -1)
                    r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
                    n = (xn + r * hn).tanh()
                    tails = tails + _tails(torch.cat([r, z], -1), "sigmoid") + _tails(n, "tanh")
                    h = (1 - z) * n + z * h
                    count += 3 * n.numel()
                hs.append(h)
            out = torch.stack(hs, 1)
            outputs.append(out.flip(1) if direction else out)
        x = torch.cat(outputs, -1)
    return x, tails / max(count, 1)
