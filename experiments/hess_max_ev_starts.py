"""How often ``HessMaxEV`` misses λ_max, by its number of start vectors, cold and warm-started.

Usage::

    python -m experiments.hess_max_ev_starts [--seeds 60] [--steps 12] [--problems mixer mlp ...] [--lr 0.5]
        [--model-seed S]

For each problem and seed a small float64 model is trained with SGD; at every step
``HessMaxEV`` with ``block=1`` and with ``block=2``, each on the step's Hessian-vector products, is
compared with ``eigvalsh`` of the autograd Hessian (``compare_with_cockpit.exact_max_eigenvalue``). A *miss* is
a value more than ``rtol`` (1e-3) below the exact λ_max. Step 0 is a cold start (random
vectors); later steps start from the previous step's top Ritz vectors (mixed with noise).
Problems: ``mixer``, the MLP-Mixer of tests/quantities/test_hess_max_ev.py whose small head
puts the top two eigenvalues 0.7 % apart (the hard case); ``mlp``, a tanh MLP with four classes
near uniform output (clusters of close eigenvalues); ``cnn``, a small convolutional net. Prints
the misses and the median products per step, cold and warm. ``--model-seed 1 --problems mixer``
is the test's Mixer (top two eigenvalues 0.7 % apart at step 0) for every seed of the starts;
a small ``--lr`` keeps close eigenvalues close over the steps.
"""

import argparse
import statistics

import torch
from torch import nn

from cockpit_lite.curvature.hvp import HessianVectorProducts
from cockpit_lite.quantities import HessMaxEV
from experiments.compare_with_cockpit import exact_max_eigenvalue

RTOL = 1e-3
torch.set_num_threads(1)  # (tiny models: a second thread only waits)


class MixerBlock(nn.Module):
    """Token mixing (an MLP across the tokens) and channel mixing, each pre-norm and residual."""

    def __init__(self, tokens, channels, hidden):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.tokens = nn.Sequential(nn.Linear(tokens, hidden), nn.GELU(), nn.Linear(hidden, tokens))
        self.channels = nn.Sequential(nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, channels))

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(nn.Module):
    """A small MLP-Mixer: 4 patches of 4 values, 6 channels, two blocks, a head for 4 classes. The head
    starts small (Mixer initialises it at zero), so the outputs are near uniform and the top Hessian
    eigenvalues come in close pairs (``torch.manual_seed(1)``: 1.0933 and 1.0855, 0.7% apart)."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(4, 6)
        self.blocks = nn.Sequential(MixerBlock(4, 6, 8), MixerBlock(4, 6, 8))
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, 4)
        with torch.no_grad():
            self.head.weight.mul_(0.1)
            self.head.bias.zero_()

    def forward(self, x):
        return self.head(self.norm(self.blocks(self.patch(x))).mean(1))


def mlp():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 4))
    with torch.no_grad():
        model[-1].weight.mul_(0.1)
    return model


def cnn():
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 2 * 2, 4))


PROBLEMS = {  # name: (model, input shape)
    "mixer": (Mixer, (4, 4)),
    "mlp": (mlp, (4, 4)),
    "cnn": (cnn, (1, 4, 4)),
}


def run(problem, seed, steps, lr=0.5, model_seed=None):
    """``{block: [(value, products)]}`` and ``[exact]`` per step of one training run: both quantities
    (``block`` 1 and 2) solve on the same step's Hessian-vector products, each from its own previous
    step (``HessMaxEV.before_backward``, as a Cockpit calls it)."""
    make, shape = PROBLEMS[problem]
    torch.manual_seed(seed if model_seed is None else model_seed)
    model = make().double()
    params = list(model.parameters())
    generator = torch.Generator().manual_seed(seed if model_seed is None else model_seed)
    x = torch.randn(8, *shape, generator=generator, dtype=torch.float64)
    y = torch.arange(8) % 4
    optimizer = torch.optim.SGD(params, lr=lr)
    solvers = {block: HessMaxEV(seed=seed, block=block) for block in (1, 2)}
    values, exact = {block: [] for block in solvers}, []
    for step in range(steps):
        optimizer.zero_grad()
        exact.append(exact_max_eigenvalue(model, nn.functional.cross_entropy, x, y))
        loss = nn.functional.cross_entropy(model(x), y)
        for block, quantity in solvers.items():
            products = HessianVectorProducts(loss, params, step, model, None)
            quantity.before_backward(step, products)
            products.release()
            values[block].append((float(quantity.compute(step, None).value), quantity.last_iterations))
        loss.backward()
        optimizer.step()
    return values, exact


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--lr", type=float, default=0.5, help="SGD's learning rate (smaller: close eigenvalues stay close)")
    parser.add_argument("--model-seed", type=int, help="one model and batch for every seed (the seeds vary the starts only)")
    args = parser.parse_args(argv)
    print(f"misses (value < (1 - {RTOL}) λ_max) of {args.seeds} seeds × {args.steps} steps; median products")
    print("problem  block  cold misses  warm misses  cold products  warm products")
    for problem in args.problems:
        runs = [run(problem, seed, args.steps, args.lr, args.model_seed) for seed in range(args.seeds)]
        for block in (1, 2):
            missed = [[value < (1 - RTOL) * e for (value, _), e in zip(values[block], exact)] for values, exact in runs]
            products = [[p for _, p in values[block]] for values, _ in runs]
            cold, warm = sum(m[0] for m in missed), sum(sum(m[1:]) for m in missed)
            print(f"{problem:7s}  {block:5d}  {cold:4d} / {args.seeds:<5d} {warm:5d} / {args.seeds * (args.steps - 1):<5d}"
                  f"  {statistics.median(p[0] for p in products):13g}  {statistics.median(q for p in products for q in p[1:]):13g}")


if __name__ == "__main__":
    main()
