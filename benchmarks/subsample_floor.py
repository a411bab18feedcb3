"""The eager floor of subsampled economy tracking: the same work, written out by hand for one model.

Usage::

    python -m benchmarks.subsample_floor [--problems mlp cnn transformer resnet_bn resnet18]
        [--repeats R] [--steps S] [--json PATH]

``bench_overhead``'s targets for ``configuration("economy")`` with ``samples=8`` (MLP ≤ 4×, CNN
≤ 1.4×, transformer ≤ 1.8×, ResNets with BatchNorm ≤ 7×) leave a few tenths of a plain step (on
the ResNets, six plain steps) for nine quantities. This asks how much of that an implementation
in eager PyTorch spends. For each of ``bench_overhead``'s problems a ``Floor`` does the work
economy needs at a subsampled step, fused by hand for that model and nothing else (mean
cross-entropy, SGD):

- before backward: the step's draw of 8 samples (``cockpit_lite.subsample.draw``, as the
  Cockpit draws it), a copy of the parameters, the drawn samples' losses;
- the drawn samples' individual gradients. ``Floor`` (MLP, CNN): each layer's input and output
  gradient from one forward hook (registered once) and one tensor hook; a Linear weight's from
  its factors (the rows of units a ReLU switched off counted as zeros, not built), a convolution
  weight's by one grouped convolution (``cockpit_lite.engine.rules.conv._weight_grads``), a
  bias's by a sum. ``TransformerFloor`` and ``GlobalFloor`` (the ResNets): see their docstrings;
- the check that the capture gives autograd's gradient of every parameter (a Linear weight's
  by a rank-3 random sketch, a convolution weight's by two random output channels, the rest
  whole; on the ResNets the gradient of the losses' sum), compared on the host;
- the per-sample squared norms and dot products with the gradient of every parameter, and
  from them ``NormTest``, ``InnerTest`` and ``OrthoTest`` of the network and of each parameter
  with their standard errors (``cockpit_lite.subsample.sqrt_estimates``);
- ``GradHist1d``'s histogram of all ``8·P`` elements (``cockpit_lite.histogram.histogram1d``),
  scaled to the batch; ``GradNorm``, ``Distance`` (from the initial parameters), ``Loss``;
- after ``optimizer.step()``: the update, ``UpdateSize``, ``Alpha``'s slopes of the drawn
  samples along it, and at the next step the new draw's slopes along it and the parabola fit
  of both ends (``quantities.alpha.fit_quadratic``);
- every value moved to the host in one transfer per dtype (``cockpit_lite.step_context._to_host``).

So a ``Floor`` over the plain step is what those quantities cost without the library's
generality (routes, rules for every layer type, schedules, records). ``agreement`` first checks
that it computes what ``Cockpit`` does: the network's ``NormTest``, ``InnerTest`` and
``OrthoTest``, each parameter's ``GradNorm`` and the histogram's counts, on identical models,
batches and draws, over four steps. Then the plain step, the ``Floor``, the ``Floor`` without
the histogram, the ``Floor`` without the check, and ``Cockpit`` with economy and ``samples=8``
are timed in interleaved rounds (medians, one thread, batch 64; ``ROUNDS`` per problem unless
``--repeats``/``--steps`` say otherwise).
"""

import argparse
import json
import statistics
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cockpit_lite import Cockpit, configuration, subsample
from cockpit_lite.step_context import _to_host
from cockpit_lite.engine import GRAD_CHECK_RTOL
from cockpit_lite.engine.rules.conv import _weight_grads
from cockpit_lite.histogram import histogram1d
from cockpit_lite.quantities.alpha import alpha_from_fit, fit_quadratic
from cockpit_lite.quantities.base import with_total
from benchmarks import bench_overhead
from experiments.common import single_thread

SAMPLES = 8
BINS, RANGE = 100, (-2.0, 2.0)
"""``GradHist1d``'s default bins and range (``agreement`` checks that the record has them)."""
SKETCH = 3
ROUNDS = {"mlp": (9, 10), "cnn": (9, 5), "transformer": (5, 3), "resnet_bn": (3, 2), "resnet18": (2, 2)}
"""Interleaved rounds and steps per round of each problem."""
DEFAULT_PROBLEMS = ("mlp", "cnn", "transformer", "resnet_bn")
"""What a run measures unless ``--problems`` says otherwise (``resnet18`` is slow: ask for it)."""


class Floor:
    """Economy's subsampled work for a model of Linear and Conv2d layers (see the module docstring)."""

    def __init__(self, model, optimizer, histogram=True, check=True):
        """``histogram``/``check``: False leaves out ``GradHist1d``'s histogram / the check of the capture."""
        self.histogram, self.check = histogram, check
        self.layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        self.params = self._tracked(model)
        self.initial = [p.detach().clone() for p in self.params]
        self.sketches = {}  # a Linear weight's random vectors u_j, v_j (``_sketch``)
        self.kept, self.previous, self.values, self.last = {}, None, None, None
        self.start_point, self.alpha, self.failed = None, None, None
        for m in self._captured(model):
            m.register_forward_hook(self._forward)
        optimizer.register_step_post_hook(lambda *_: self._after_step())

    def _tracked(self, model):
        return [p for m in self.layers for p in (m.weight, m.bias)]

    def _captured(self, model):
        """The modules whose input and output gradient a forward hook keeps."""
        return self.layers

    def _forward(self, module, inputs, output):
        self.kept[module] = [inputs[0].detach(), None]
        output.register_hook(lambda grad: self.kept[module].__setitem__(1, grad.detach()))

    def start(self, step, outputs, targets):
        """Before backward: the draw, θ_t, the drawn samples' losses."""
        self.batch = outputs.shape[0]
        self.rows = subsample.draw(SAMPLES, self.batch, (0, step))
        self.before = torch._foreach_mul([p.detach() for p in self.params], 1.0)
        self.losses = F.cross_entropy(outputs.detach()[self.rows], targets[self.rows], reduction="none")

    def _individual(self, b, rows, grads):
        """``(squares, dots, checks, histogram, factors)``: per parameter, in ``self.params``' order,
        the drawn samples' squared norms and dot products with the gradient; the pairs (from the
        capture, autograd's) the check compares; the histogram of the individual gradients' elements
        (``_histogram``); per parameter the factors the slopes need (``_start_slopes``)."""
        squares, dots, checks, elements, factors, off = [], [], [], [], [], 0
        for m, gw, gb in zip(self.layers, grads[::2], grads[1::2]):
            a, delta = self.kept[m]
            if isinstance(m, nn.Linear):
                if self.check:
                    checks.append(self._sketch(m.weight, a, delta, gw))
                da, ad = delta[rows] * b, a[rows]
                if self.histogram:
                    live = da.reshape(-1) != 0  # rows of units a ReLU switched off are zeros, not built
                    rows_of = ad.repeat_interleave(da.shape[1], 0)[live]
                    elements.append((da.reshape(-1)[live][:, None] * rows_of).reshape(-1))
                    off += (da.numel() - int(live.sum())) * ad.shape[1]
                squares.append((da**2).sum(1) * (ad**2).sum(1))
                dots.append(((da @ gw) * ad).sum(1))
                factors.append(("linear", da, ad))
            else:
                if self.check:
                    channels = torch.randperm(m.weight.shape[0])[:2].sort().values
                    part = _weight_grads(m, a, delta[:, channels].contiguous(), m.weight[channels], stacked=False)
                    checks.append((part, gw[channels]))
                flat = _weight_grads(m, a[rows], delta[rows] * b, m.weight).flatten(1)
                _dense(flat, gw, squares, dots, elements if self.histogram else None, factors)
                da = (delta[rows] * b).flatten(2).sum(2)
            if self.check:
                checks.append((delta.flatten(2).sum(2).sum(0) if delta.dim() > 2 else delta.sum(0), gb))
            _dense(da, gb, squares, dots, elements if self.histogram else None, factors)
        return squares, dots, checks, self._histogram(elements, off), factors

    def _histogram(self, elements, zeros=0):
        """``(counts, clipped, nonfinite)`` of the elements and ``zeros`` zeros not formed (``None``: no histogram)."""
        if not self.histogram:
            return None
        counts, clipped, nonfinite = histogram1d(torch.cat(elements), BINS, RANGE)
        counts[BINS // 2] += zeros  # 0 lies in the middle bin of the symmetric range
        return counts, clipped, nonfinite

    def _sketch(self, weight, a, delta, grad):
        """The check of a Linear weight: ``u_jᵀ (Σ_rows δ aᵀ) v_j`` (``j < SKETCH``) from the captured
        rows, and the same of autograd's gradient; ``u_j, v_j`` drawn once per weight."""
        if weight not in self.sketches:
            self.sketches[weight] = (torch.randn(SKETCH, weight.shape[0]), torch.randn(SKETCH, weight.shape[1]))
        u, v = self.sketches[weight]
        a, delta = a.reshape(-1, a.shape[-1]), delta.reshape(-1, delta.shape[-1])
        return ((u @ delta.T) * (v @ a.T)).sum(1), ((u @ grad) * v).sum(1)

    def finish(self, loss):
        """After backward: the drawn samples' individual gradients and every statistic but the update's."""
        b, rows, out = self.batch, self.rows, {}
        grads = [p.grad.detach() for p in self.params]
        squares, dots, checks, histogram, factors = self._individual(b, rows, grads)
        g2 = with_total(torch.stack([(g**2).sum() for g in grads]))
        (squares, dots), zero = (with_total(torch.stack(x, 1)) for x in (squares, dots)), torch.zeros_like(g2)
        out["norm_test"] = subsample.sqrt_estimates(squares, b, b * g2, (b - 1) * b * g2)
        out["inner_test"] = subsample.sqrt_estimates((dots - g2) ** 2, b, zero, (b - 1) * b * g2**2)
        out["ortho_test"] = subsample.sqrt_estimates(squares - dots**2 / g2, b, zero, (b - 1) * b * g2)
        out["grad_norm"] = torch._foreach_norm(grads)
        out["distance"] = torch._foreach_norm(torch._foreach_sub([p.detach() for p in self.params], self.initial))
        if histogram is not None:
            out["hist"] = (histogram[0].double() * (b / SAMPLES), *histogram[1:])
        if self.check:
            out["check"] = torch.stack([torch.stack([(x - y).norm(), y.norm()]) for x, y in checks])
        out["loss"] = loss.detach()
        if self.previous is not None:  # Alpha's end point: the new draw's losses and slopes along the last update
            out["end"] = _moments(self.losses, self._end_slopes(factors))
        self.factors, self.grads, self.values, self.last = factors, grads, out, out

    def _start_slopes(self, factors, update):
        """``g̃_nᵀ d`` of the drawn samples for an update ``d`` (one tensor per parameter)."""
        total = 0
        for (kind, x, y), d in zip(factors, update):
            total = total + (((x @ d) * y).sum(1) if kind == "linear" else x @ d.reshape(-1))
        return total

    def _end_slopes(self, factors):
        """The new draw's ``g̃_nᵀ d`` along the last update ``d``."""
        return self._start_slopes(factors, self.previous)

    def _after_step(self):
        """After the step: the update, its size, Alpha's start point, the transfer and checks, the fit."""
        if self.values is None:
            return
        update = torch._foreach_sub([p.detach() for p in self.params], self.before)
        out, self.values = self.values, None
        out["update_size"] = torch._foreach_norm(update)
        out["start"] = _moments(self.losses, self._start_slopes(self.factors, update))
        host = _to_host({key: _plain(value) for key, value in out.items()})
        if self.check:
            error, scale = host["check"].T
            self.failed = np.flatnonzero(error > GRAD_CHECK_RTOL[torch.float32] * scale)
        if "end" in host and self.start_point is not None:
            start, end = self.start_point, host["end"]  # x ∈ [0, 1] along the update: t = 1
            self.alpha = alpha_from_fit(fit_quadratic(1.0, [start[0], end[0]], [start[1], end[1]],
                                                      [start[2], end[2]], [start[3], end[3]]), 1.0)
        self.start_point, self.previous = host["start"], update


def _dense(flat, grad, squares, dots, elements, factors):
    """Squared norms, dot products with ``grad``, elements (unless ``elements`` is None) and factors
    of formed individual gradients ``[k, D]``."""
    squares.append((flat**2).sum(1))
    dots.append(flat @ grad.reshape(-1))
    if elements is not None:
        elements.append(flat.reshape(-1))
    factors.append(("dense", flat, None))


class TransformerFloor(Floor):
    """``Floor`` for ``bench_overhead.TransformerClassifier``: token embedding and positions, encoder
    layers (packed self-attention, two Linear layers with a sequence axis, two LayerNorms), a Linear
    head on the mean over positions.

    The captures: forward hooks on the Linear and LayerNorm modules and the embedding; for the
    attention, the input rows the projections' autograd nodes saved and their output gradients, from
    pre-hooks on those nodes (found from the parameters' gradient accumulators once per step), as
    the attention is never re-run. The individual gradients of the drawn samples are formed (a
    sequence layer's ``[k, out, in]`` by one contraction over positions), the LayerNorms' from their
    normalised inputs recomputed for the drawn samples; the check recomputes them for all samples, as
    it needs the whole batch's sum.
    """

    def __init__(self, model, optimizer, histogram=True, check=True):
        self.model = model
        super().__init__(model, optimizer, histogram, check)

    def _tracked(self, model):
        return list(model.parameters())

    def _captured(self, model):
        return [m for m in model.modules() if isinstance(m, (nn.Linear, nn.LayerNorm, nn.Embedding))]

    def start(self, step, outputs, targets):
        super().start(step, outputs, targets)
        users, accumulators, stack, seen = {}, {}, [outputs.grad_fn], set()
        while stack:  # the graph's consumers of each node, the parameters' accumulators
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            for following, _ in node.next_functions:
                if following is not None:
                    users.setdefault(following, []).append(node)
                    if type(following).__name__ == "AccumulateGrad":
                        accumulators[following.variable] = following
                    stack.append(following)
        for m in self.model.modules():
            if isinstance(m, nn.MultiheadAttention):
                for weight in (m.in_proj_weight, m.out_proj.weight):
                    node = users[users[accumulators[weight]][0]][0]  # TBackward0, then the product
                    node.register_prehook(lambda grads, node=node, weight=weight: self.kept.__setitem__(
                        weight, [_saved_rows(node).detach(), grads[0].detach()]))

    def _individual(self, b, rows, grads):
        squares, dots, checks, elements, factors = [], [], [], [], []
        grad_of = dict(zip(self.params, grads))
        formed = {}  # parameter -> [k, D] individual gradients of the drawn samples
        elements_or_none = elements if self.histogram else None
        for m in self.model.modules():
            if isinstance(m, nn.Embedding):
                ids, delta = self.kept[m]
                v, d = m.weight.shape
                k = len(rows)
                index = (ids[rows] + torch.arange(k)[:, None] * v).reshape(-1)
                dr = (delta[rows] * b).reshape(-1, d)
                formed[m.weight] = delta.new_zeros(k * v, d).index_add_(0, index, dr).view(k, -1)
                formed[self.model.pos] = (delta[rows] * b).reshape(k, -1)
                if self.check:
                    checks.append((delta.new_zeros(v, d).index_add_(0, ids.reshape(-1), delta.reshape(-1, d)),
                                   grad_of[m.weight]))
                    checks.append((delta.sum(0), grad_of[self.model.pos]))
            elif isinstance(m, nn.MultiheadAttention):
                for weight, bias in ((m.in_proj_weight, m.in_proj_bias), (m.out_proj.weight, m.out_proj.bias)):
                    a, delta = (t.reshape(-1, self.batch, t.shape[-1]).transpose(0, 1) for t in self.kept[weight])
                    self._sequence_linear(weight, bias, a, delta, b, rows, grad_of, formed, checks)
            elif isinstance(m, nn.Linear) and m.weight not in formed:  # (the attention's out_proj was served above)
                a, delta = self.kept[m]
                if a.dim() == 2:
                    a, delta = a[:, None], delta[:, None]
                self._sequence_linear(m.weight, m.bias, a, delta, b, rows, grad_of, formed, checks)
            elif isinstance(m, nn.LayerNorm):
                x, delta = self.kept[m]
                normalised = F.layer_norm(x[rows], m.normalized_shape, eps=m.eps)
                dr = delta[rows] * b
                formed[m.weight] = (dr * normalised).sum(1)
                formed[m.bias] = dr.sum(1)
                if self.check:
                    whole = F.layer_norm(x, m.normalized_shape, eps=m.eps)
                    checks.append(((delta * whole).sum((0, 1)), grad_of[m.weight]))
                    checks.append((delta.sum((0, 1)), grad_of[m.bias]))
        for param in self.params:
            _dense(formed[param], grad_of[param], squares, dots, elements_or_none, factors)
        return squares, dots, checks, self._histogram(elements), factors

    def _sequence_linear(self, weight, bias, a, delta, b, rows, grad_of, formed, checks):
        """A Linear layer's drawn samples' ``Σ_t δ_t a_tᵀ`` (``[k, out, in]``) and bias, and its check."""
        dr, ar = delta[rows] * b, a[rows]
        formed[weight] = torch.einsum("nto,nti->noi", dr, ar).reshape(len(rows), -1)
        formed[bias] = dr.sum(1)
        if self.check:
            checks.append(self._sketch(weight, a, delta, grad_of[weight]))
            checks.append((delta.sum((0, 1)), grad_of[bias]))


class GlobalFloor(Floor):
    """``Floor`` for a network with BatchNorm in training mode (``bench_overhead.resnet_bn``,
    ``resnet18``), where a sample's loss depends on every sample through the batch statistics: each
    drawn sample's individual gradient is one vector-Jacobian product through the whole graph (the
    global path), taken before the backward pass, and its statistics are taken at once (the
    histogram accumulated, nothing of ``[k, P]`` held). The check is the gradient of the sum of the
    losses, one more product, against autograd's; ``Alpha``'s slopes at the start are along the update
    predicted in backward (plain SGD's ``−η g``, as ``cockpit_lite.optim.UpdatePredictor`` predicts
    it), at the end along the last update.
    """

    def __init__(self, model, optimizer, histogram=True, check=True):
        self.model, self.lr = model, optimizer.param_groups[0]["lr"]
        super().__init__(model, optimizer, histogram, check)

    def _tracked(self, model):
        return list(model.parameters())

    def _captured(self, model):
        return []  # each drawn sample's gradient is a vector-Jacobian product of the whole graph

    def start(self, step, outputs, targets):
        super().start(step, outputs, targets)
        losses = F.cross_entropy(outputs, targets, reduction="none")
        self.sample_grads = [torch.autograd.grad(losses[n], self.params, retain_graph=True) for n in self.rows.tolist()]
        if self.check:
            self.totals = torch.autograd.grad(losses.sum() / self.batch, self.params, retain_graph=True)

    def _individual(self, b, rows, grads):
        squares, dots, end, histogram = [], [], [], None
        for sample in self.sample_grads:
            flats = [g.reshape(-1) for g in sample]
            squares.append(torch.stack([f.dot(f) for f in flats]))
            dots.append(torch.stack([f.dot(g.reshape(-1)) for f, g in zip(flats, grads)]))
            if self.previous is not None:
                end.append(sum(f.dot(d.reshape(-1)) for f, d in zip(flats, self.previous)))
            if self.histogram:  # accumulated sample by sample
                part = histogram1d(torch.cat(flats), BINS, RANGE, out=None if histogram is None else histogram[0])
                histogram = part if histogram is None else (part[0], histogram[1] + part[1], histogram[2] + part[2])
        self.sample_grads = None
        squares, dots = torch.stack(squares), torch.stack(dots)
        factors = {"start": -self.lr * dots.sum(1), "end": torch.stack(end) if end else None}
        checks = list(zip(self.totals, grads)) if self.check else []
        return list(squares.unbind(1)), list(dots.unbind(1)), checks, histogram, factors

    def _end_slopes(self, factors):
        return factors["end"]

    def _start_slopes(self, factors, update):
        return factors["start"]


def _saved_rows(node):
    """The input rows a projection's node saved: ``x`` of ``mm(x, Wᵀ)``, ``x`` of ``addmm(b, x, Wᵀ)``."""
    return node._saved_self if type(node).__name__ == "MmBackward0" else node._saved_mat1


def _plain(value):
    """An ``Output``'s tensors as a tuple (value, layers, standard errors) for ``_to_host``."""
    return (value.value, value.layers, value.meta["se"], value.meta["layers_se"]) if hasattr(value, "meta") else value


def _moments(losses, slopes):
    """Means and variances of the drawn samples' losses and slopes (what Alpha's fit and its error take)."""
    return torch.stack([losses.mean(), slopes.mean(), losses.var(), slopes.var()])


FLOORS = {"mlp": Floor, "cnn": Floor, "transformer": TransformerFloor, "resnet_bn": GlobalFloor,
          "resnet18": GlobalFloor}
"""``bench_overhead``'s problems that have a ``Floor``."""


class FloorRunner(bench_overhead.Runner):
    """``bench_overhead.Runner`` (same model, batches, optimizer) whose step runs ``Floor``."""

    def __init__(self, problem, **options):
        super().__init__(problem)
        self.floor = FLOORS[problem](self.model, self.opt, **options)

    def run_step(self):
        x, y = self.batches[self.step % len(self.batches)]
        self.opt.zero_grad()
        self.floor.kept = {}
        outputs = self.model(x)
        loss = self.lossfunc(outputs, y)
        self.floor.start(self.step, outputs, y)
        loss.backward()
        self.floor.finish(loss)
        self.opt.step()
        self.step += 1


def _economy_runner(problem):
    return bench_overhead.Runner(problem, lambda m: Cockpit(m, configuration("economy"), diagnose=False,
                                                             samples=SAMPLES), backpack=False)


def agreement(problem, steps=4):
    """The largest relative difference between ``Floor``'s values and ``Cockpit``'s (economy,
    ``samples=8``) over ``steps`` steps of identical models, batches and draws: the network's
    ``NormTest``, ``InnerTest`` and ``OrthoTest``, each parameter's ``GradNorm``, and the
    histogram's counts (their absolute differences over the number of elements)."""
    floor, lite = FloorRunner(problem), _economy_runner(problem)
    worst = 0.0
    for _ in range(steps):
        floor.run_step()
        lite.run_step()
        ours, record = floor.floor.last, lite.cp.get_output()[lite.step - 1]
        pairs = [(float(ours[key].value), record[name]) for key, name in
                 (("norm_test", "NormTest"), ("inner_test", "InnerTest"), ("ortho_test", "OrthoTest"))]
        pairs += list(zip((float(n) for n in ours["grad_norm"]), record["GradNorm"]))
        hist = record["GradHist1d"]
        if len(hist["edges"]) != BINS + 1 or (hist["edges"][0], hist["edges"][-1]) != RANGE:
            raise RuntimeError(f"GradHist1d's bins span {hist['edges'][0]}..{hist['edges'][-1]}, not {RANGE}")
        counts = ours["hist"][0].numpy()
        worst = max(worst, float(np.abs(counts - hist["hist"]).sum() / hist["hist"].sum()),
                    *(abs(a - b) / max(abs(b), 1e-30) for a, b in pairs))
    return worst


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.subsample_floor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=list(DEFAULT_PROBLEMS), choices=list(FLOORS))
    parser.add_argument("--repeats", type=int, help="interleaved rounds (default: ROUNDS')")
    parser.add_argument("--steps", type=int, help="steps per round (default: ROUNDS')")
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    single_thread()
    warnings.simplefilter("ignore")
    results = {}
    print(f"step time / plain step time (median of interleaved rounds, batch {bench_overhead.BATCH}, 1 thread)")
    for problem in args.problems:
        repeats, steps = args.repeats or ROUNDS[problem][0], args.steps or ROUNDS[problem][1]
        difference = agreement(problem)
        runners = {"plain": bench_overhead.Runner(problem), "floor": FloorRunner(problem),
                   "floor, no histogram": FloorRunner(problem, histogram=False),
                   "floor, no check": FloorRunner(problem, check=False), "economy": _economy_runner(problem)}
        times = {name: [] for name in runners}
        for _ in range(repeats):
            for name, runner in runners.items():
                times[name].append(runner.time_steps(steps))
        plain = statistics.median(times["plain"])
        results[problem] = {"plain_ms": plain * 1e3, "difference": difference,
                            **{name: statistics.median(t) / plain for name, t in times.items() if name != "plain"}}
        print(f"{problem} ({repeats} rounds of {steps} steps): plain step {plain * 1e3:.3f} ms; Floor against "
              f"Cockpit: largest relative difference {difference:.1e}")
        for name in runners:
            if name != "plain":
                print(f"  {name:<{max(map(len, runners))}} {results[problem][name]:6.2f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
