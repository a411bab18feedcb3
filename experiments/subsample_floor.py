"""The eager floor of subsampled economy tracking: the same work, written out by hand for one model.

Usage::

    python -m experiments.subsample_floor [--problems mlp cnn] [--repeats 9] [--steps 10] [--json PATH]

``bench_overhead``'s targets for ``configuration("economy")`` with ``samples=8`` (MLP ≤ 4×, CNN
≤ 1.4×) leave a few tenths of a plain step for nine quantities. This asks how much of that any
implementation in eager PyTorch spends. ``Floor`` does, for a model of ``nn.Linear`` and
``nn.Conv2d`` layers (no sequence axis, no normalisation layer; mean cross-entropy; SGD), the
work economy needs at a subsampled step, fused by hand for that model and nothing else:

- before backward: the step's draw of 8 samples (``cockpit_lite.subsample.draw``, as the
  Cockpit draws it), a copy of the parameters, the drawn samples' losses;
- each layer's input and output gradient, from one forward hook (registered once) and one
  tensor hook;
- the drawn samples' individual gradients: a Linear weight's from its factors (the rows of
  units a ReLU switched off counted as zeros, not built), a convolution weight's by one grouped
  convolution (``cockpit_lite.engine.rules.conv._weight_grads``), a bias's by a sum;
- the check that the captured factors of all samples give autograd's gradient (a Linear
  weight's by a rank-3 random sketch, a convolution weight's by two random output channels, a
  bias whole), compared on the host;
- the per-sample squared norms and dot products with the gradient of every parameter, and
  from them ``NormTest``, ``InnerTest`` and ``OrthoTest`` of the network and of each parameter
  with their standard errors (``cockpit_lite.subsample.sqrt_estimates``);
- ``GradHist1d``'s histogram of all ``8·P`` elements (``cockpit_lite.histogram.histogram1d``),
  scaled to the batch; ``GradNorm``, ``Distance`` (from the initial parameters), ``Loss``;
- after ``optimizer.step()``: the update, ``UpdateSize``, ``Alpha``'s slopes of the drawn
  samples along it (the kept factors projected onto it), and at the next step the new draw's
  slopes along it and the parabola fit of both ends;
- every value moved to the host in one transfer per dtype.

So ``Floor`` over the plain step is what those quantities cost without the library's generality
(routes, rules for every layer type, schedules, records). ``agreement`` first checks that
``Floor`` computes what ``Cockpit`` does: the network's ``NormTest``, ``InnerTest`` and
``OrthoTest``, each parameter's ``GradNorm`` and the histogram's counts, on identical models,
batches and draws, over four steps. Then the plain step, ``Floor``, ``Floor`` without the
histogram, ``Floor`` without the check, and ``Cockpit`` with economy and ``samples=8`` are timed in
interleaved rounds (medians, one thread, batch 64).
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
from cockpit_lite.engine import GRAD_CHECK_RTOL
from cockpit_lite.engine.rules.conv import _weight_grads
from cockpit_lite.histogram import histogram1d
from cockpit_lite.quantities.base import with_total
from experiments import bench_overhead
from experiments.common import single_thread

SAMPLES = 8
BINS, RANGE = 100, (-2.0, 2.0)
"""``GradHist1d``'s default bins and range (``agreement`` checks that the record has them)."""
SKETCH = 3


class Floor:
    """Economy's subsampled work for a model of Linear and Conv2d layers (see the module docstring)."""

    def __init__(self, model, optimizer, histogram=True, check=True):
        """``histogram``/``check``: False leaves out ``GradHist1d``'s histogram / the check of the capture."""
        self.histogram, self.check = histogram, check
        self.layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        self.params = [p for m in self.layers for p in (m.weight, m.bias)]
        self.initial = [p.detach().clone() for p in self.params]
        self.sketches = {m: (torch.randn(SKETCH, m.weight.shape[0]), torch.randn(SKETCH, m.weight.shape[1]))
                         for m in self.layers if isinstance(m, nn.Linear)}
        self.kept, self.previous, self.values, self.last = {}, None, None, None
        self.start_point, self.alpha, self.failed = None, None, None
        for m in self.layers:
            m.register_forward_hook(self._forward)
        optimizer.register_step_post_hook(lambda *_: self._after_step())

    def _forward(self, module, inputs, output):
        self.kept[module] = [inputs[0].detach(), None]
        output.register_hook(lambda grad: self.kept[module].__setitem__(1, grad.detach()))

    def start(self, step, outputs, targets):
        """Before backward: the draw, θ_t, the drawn samples' losses."""
        self.rows = subsample.draw(SAMPLES, outputs.shape[0], (0, step))
        self.before = torch._foreach_mul([p.detach() for p in self.params], 1.0)
        self.losses = F.cross_entropy(outputs.detach()[self.rows], targets[self.rows], reduction="none")

    def finish(self, loss):
        """After backward: the drawn samples' individual gradients and every statistic but the update's."""
        b, rows, out = self.kept[self.layers[0]][0].shape[0], self.rows, {}
        grads = [p.grad.detach() for p in self.params]
        squares, dots, checks, elements, factors, off = [], [], [], [], [], 0
        for m, gw, gb in zip(self.layers, grads[::2], grads[1::2]):
            a, delta = self.kept[m]
            if isinstance(m, nn.Linear):
                u, v = self.sketches[m]
                if self.check:
                    checks.append((((u @ delta.T) * (v @ a.T)).sum(1), ((u @ gw) * v).sum(1)))
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
                if self.histogram:
                    elements.append(flat.reshape(-1))
                squares.append((flat**2).sum(1))
                dots.append(flat @ gw.reshape(-1))
                factors.append(("conv", flat, None))
                da = (delta[rows] * b).flatten(2).sum(2)
            if self.check:
                checks.append((delta.flatten(2).sum(2).sum(0) if delta.dim() > 2 else delta.sum(0), gb))
            if self.histogram:
                elements.append(da.reshape(-1))
            squares.append((da**2).sum(1))
            dots.append(da @ gb)
            factors.append(("bias", da, None))
        g2 = with_total(torch.stack([(g**2).sum() for g in grads]))
        (squares, dots), zero = (with_total(torch.stack(x, 1)) for x in (squares, dots)), torch.zeros_like(g2)
        out["norm_test"] = subsample.sqrt_estimates(squares, b, b * g2, (b - 1) * b * g2)
        out["inner_test"] = subsample.sqrt_estimates((dots - g2) ** 2, b, zero, (b - 1) * b * g2**2)
        out["ortho_test"] = subsample.sqrt_estimates(squares - dots**2 / g2, b, zero, (b - 1) * b * g2)
        out["grad_norm"] = torch._foreach_norm(grads)
        out["distance"] = torch._foreach_norm(torch._foreach_sub([p.detach() for p in self.params], self.initial))
        if self.histogram:
            counts, clipped, nonfinite = histogram1d(torch.cat(elements), BINS, RANGE)
            counts[BINS // 2] += off  # 0 lies in the middle bin of the symmetric range
            out["hist"] = (counts.double() * (b / SAMPLES), clipped, nonfinite)
        if self.check:
            out["check"] = torch.stack([torch.stack([(x - y).norm(), y.norm()]) for x, y in checks])
        out["loss"] = loss.detach()
        if self.previous is not None:  # Alpha's end point: the new draw's losses and slopes along the last update
            out["end"] = _moments(self.losses, self._slopes(factors, self.previous))
        self.factors, self.grads, self.values, self.last = factors, grads, out, out

    def _slopes(self, factors, update):
        """``g̃_nᵀ d`` of the drawn samples for an update ``d`` (one tensor per parameter)."""
        total = 0
        for (kind, x, y), d in zip(factors, update):
            total = total + (((x @ d) * y).sum(1) if kind == "linear" else x @ d.reshape(-1))
        return total

    def _after_step(self):
        """After the step: the update, its size, Alpha's start point, the transfer and checks, the fit."""
        if self.values is None:
            return
        update = torch._foreach_sub([p.detach() for p in self.params], self.before)
        out, self.values = self.values, None
        out["update_size"] = torch._foreach_norm(update)
        out["start"] = _moments(self.losses, self._slopes(self.factors, update))
        host = _to_host(out)
        if self.check:
            error, scale = host["check"].T
            self.failed = np.flatnonzero(error > GRAD_CHECK_RTOL[torch.float32] * scale)
        if "end" in host and self.start_point is not None:
            self.alpha = _alpha(self.start_point, host["end"])
        self.start_point, self.previous = host["start"], update


def _moments(losses, slopes):
    """Means and variances of the drawn samples' losses and slopes (what Alpha's fit and its error take)."""
    return torch.stack([losses.mean(), slopes.mean(), losses.var(), slopes.var()])


def _alpha(start, end):
    """α = 1/x* − 1 of the parabola fitted, weighted by the observations' variances, to the mean
    losses and slopes at both ends of an update (x ∈ [0, 1] along it, x* its minimum; −1 if concave)."""
    design = np.array([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [2.0, 1.0, 0.0]])
    observed = np.array([start[0], end[0], start[1], end[1]])
    weights = 1 / np.sqrt(np.maximum(np.array([start[2], end[2], start[3], end[3]]), 1e-10))
    (a, b, _), *_ = np.linalg.lstsq(design * weights[:, None], observed * weights, rcond=None)
    return -1.0 if a <= 0 else float(-2 * a / b - 1)


def _to_host(tree):
    """A dict of tensors, lists and tuples of tensors and ``Output``s on the host as numpy arrays,
    the tensors of one dtype in one transfer."""
    found = {}

    def collect(key, node):
        if torch.is_tensor(node):
            found[key] = node
        elif isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                collect(f"{key}.{i}", item)
        elif hasattr(node, "value"):  # an Output
            collect(key, node.value)
            collect(f"{key}.layers", node.layers)
            collect(f"{key}.se", node.meta["se"])
            collect(f"{key}.layers_se", node.meta["layers_se"])

    for key, node in tree.items():
        collect(key, node)
    groups = {}
    for key, tensor in found.items():
        groups.setdefault(tensor.dtype, []).append(key)
    host = {}
    for keys in groups.values():
        flat, offset = torch.cat([found[k].reshape(-1) for k in keys]).numpy(), 0
        for key in keys:
            n = found[key].numel()
            host[key] = flat[offset : offset + n].reshape(found[key].shape)
            offset += n
    return host


class FloorRunner(bench_overhead.Runner):
    """``bench_overhead.Runner`` (same model, batches, optimizer) whose step runs ``Floor``."""

    def __init__(self, problem, **options):
        super().__init__(problem)
        self.floor = Floor(self.model, self.opt, **options)

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
    parser = argparse.ArgumentParser(prog="python -m experiments.subsample_floor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    single_thread()
    warnings.simplefilter("ignore")
    results = {}
    print(f"step time / plain step time (median of {args.repeats} interleaved rounds of {args.steps} steps, "
          f"batch {bench_overhead.BATCH}, 1 thread)")
    for problem in args.problems:
        difference = agreement(problem)
        runners = {"plain": bench_overhead.Runner(problem), "floor": FloorRunner(problem),
                   "floor, no histogram": FloorRunner(problem, histogram=False),
                   "floor, no check": FloorRunner(problem, check=False), "economy": _economy_runner(problem)}
        times = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, runner in runners.items():
                times[name].append(runner.time_steps(args.steps))
        plain = statistics.median(times["plain"])
        results[problem] = {"plain_ms": plain * 1e3, "difference": difference,
                            **{name: statistics.median(t) / plain for name, t in times.items() if name != "plain"}}
        print(f"{problem}: plain step {plain * 1e3:.3f} ms; Floor against Cockpit: largest relative "
              f"difference {difference:.1e}")
        for name in runners:
            if name != "plain":
                print(f"  {name:<{max(map(len, runners))}} {results[problem][name]:6.2f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
