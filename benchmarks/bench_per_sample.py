"""Per-sample work against the tools a user would pick instead: Opacus, torch.func, BackPACK.

Usage::

    python -m benchmarks.bench_per_sample [--repeats 5] [--steps 3] [--problems ...] [--json PATH]

The work: a training step (forward, backward, SGD) plus, exactly, every sample's squared
gradient norm ``‖g̃_n‖²`` and the elementwise ``Σ_n g̃_n²`` and ``Σ_n g̃_n``: what the norm
test, the gradient variance and the mean GSNR need. Each tool does it its own way:

- cockpit-lite: ``Cockpit(model, [NormTest(), GradVariance(), MeanGSNR()])``, every step
  tracked (``diagnose=False``), the record moved to the host as in any run;
- Opacus: ``GradSampleModule`` (the model first through ``ModuleValidator.fix``, which
  swaps ``nn.MultiheadAttention`` for its ``DPMultiheadAttention``), the statistics from
  ``p.grad_sample``;
- torch.func: ``vmap(grad(·))`` of one sample's loss over the batch with
  ``functional_call``; the mean of the individual gradients is the step's gradient
  (no separate backward pass);
- BackPACK: ``extend``ed model and loss, ``backpack(BatchL2Grad(), SumGradSquared())``
  (Sequential models of supported layers only: MLP and CNN).

Each tool's numbers are checked first: on the same weights and batch, the norm test,
total gradient variance and mean GSNR from its individual gradients (the formulas of
``cockpit_lite.quantities``) against cockpit-lite's record; a tool whose numbers differ by
more than ``TOLERANCE`` (relative) is marked "differs". Opacus treats the positions of
``wpe(torch.arange(T))`` as samples (the GPT here uses such a position embedding, as
nanoGPT does), and its ``DPMultiheadAttention`` with ``batch_first=True`` (opacus 1.6)
reshapes the heads' outputs without transposing them: the model it trains is not the
user's (``ModuleValidator.fix`` of the transformer changes its outputs; timed anyway).

Problems (batch 64, one thread, cross-entropy): the MLP, CNN and transformer of
``bench_overhead``; a nanoGPT-style GPT (2 pre-norm blocks, d = 64, T = 32,
vocabulary 256, position embedding, tied head; token loss, a sample is a sequence); a
ResNet with GroupNorm (``bench_overhead``'s ResNet with ``GroupNorm(4, ·)`` in place of
BatchNorm). Timings are medians over ``--repeats`` interleaved rounds of ``--steps`` steps
after a warm-up step; ratios are to the plain step of the same rounds.
"""

import argparse
import json
import statistics
import time
import warnings

import torch
from torch import nn

from benchmarks import bench_overhead

BATCH = 64
TOLERANCE = 1e-3
"""Largest relative difference of a tool's statistics from cockpit-lite's (float32)."""
EPSILON = 1e-5
"""``MeanGSNR``'s default ε."""


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (one qkv Linear, SDPA) and a GELU MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, 2))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """nanoGPT-style: token and position embeddings (``wpe(arange(T))``), blocks, final norm, tied head."""

    def __init__(self, vocab=256, d=64, length=32, blocks=2, heads=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(length, d)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(blocks)))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def resnet_gn():
    """``bench_overhead.resnet_bn`` with ``GroupNorm(4, C)`` in place of each BatchNorm."""
    model = bench_overhead.resnet_bn()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, name, nn.GroupNorm(4, child.num_features))
    return model


def token_loss(logits, targets):
    """Mean cross-entropy over every token of ``[B, T, V]`` logits."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _images(shape):
    return lambda g: (torch.randn(BATCH, *shape, generator=g), torch.randint(0, 10, (BATCH,), generator=g))


def _tokens(g):
    return torch.randint(0, 100, (BATCH, 32), generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def _text(g):
    ids = torch.randint(0, 256, (BATCH, 33), generator=g)
    return ids[:, :-1], ids[:, 1:]


PROBLEMS = {
    # name: (model builder, batch maker, loss, BackPACK supports it)
    "mlp": (bench_overhead.mlp, _images((1, 28, 28)), nn.functional.cross_entropy, True),
    "cnn": (bench_overhead.cnn, _images((3, 32, 32)), nn.functional.cross_entropy, True),
    "transformer": (bench_overhead.TransformerClassifier, _tokens, nn.functional.cross_entropy, False),
    "gpt": (GPT, _text, token_loss, False),
    "resnet_gn": (resnet_gn, _images((3, 32, 32)), nn.functional.cross_entropy, False),
}


def statistics_of(batch_size, sq_norms, sums, sums_of_squares):
    """Totals of the three quantities from ``Σ_p ‖g̃_{n,p}‖²`` ([B]) and per parameter
    ``Σ_n g̃_n``, ``Σ_n g̃_n²``: (norm test, total gradient variance, mean GSNR), on the host."""
    b = batch_size
    grads = [s / b for s in sums]
    grad_l2 = sum((g ** 2).sum() for g in grads)
    norm_test = ((sq_norms.sum() - b * grad_l2).clamp(min=0) / ((b - 1) * b * grad_l2)).sqrt()
    variance = sum(((m2 - b * g ** 2) / (b - 1)).sum() for m2, g in zip(sums_of_squares, grads))
    gsnr = torch.cat([(g ** 2 / (m2 / b - g ** 2 + EPSILON)).reshape(-1) for m2, g in zip(sums_of_squares, grads)])
    return torch.stack([norm_test, variance, gsnr.mean()]).tolist()


def from_individual(individual):
    """``statistics_of`` the individual gradients ``[B, *shape]`` of every parameter."""
    batch_size = individual[0].shape[0]
    flat = [g.reshape(batch_size, -1) for g in individual]
    squares = [f * f for f in flat]  # one pass over the [B, D] individual gradients each
    sq_norms = sum(s.sum(1) for s in squares)
    return statistics_of(batch_size, sq_norms, [f.sum(0) for f in flat], [s.sum(0) for s in squares])


class Tool(bench_overhead.Runner):
    """One way of doing the step and the per-sample work; ``per_sample_step(x, y)`` returns the statistics
    (timed by ``bench_overhead.Runner.time_steps``)."""

    def __init__(self, problem):
        build, self.batch, self.loss_fn, _ = PROBLEMS[problem]
        torch.manual_seed(0)
        self.model = build()
        self.setup()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1)
        self.batches = [self.batch(g) for _ in range(4)]
        self.step, self.period, self.skip = 0, 1, 0

    def setup(self):
        pass

    def run_step(self):
        x, y = self.batches[self.step % len(self.batches)]
        self.opt.zero_grad()
        stats = self.per_sample_step(x, y)
        self.opt.step()
        self.step += 1
        return stats


class Plain(Tool):
    def per_sample_step(self, x, y):
        self.loss_fn(self.model(x), y).backward()


class Lite(Tool):
    def setup(self):
        from cockpit_lite import Cockpit, quantities

        self.cp = Cockpit(self.model, [quantities.NormTest(), quantities.GradVariance(), quantities.MeanGSNR()],
                          diagnose=False)

    def per_sample_step(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        with self.cp(self.step, info={"loss": loss, "optimizer": self.opt}):
            loss.backward()
        if self.step:  # the record is written at every step; read back for the check only
            return None
        record = self.cp.get_output()[self.step]
        return [record["NormTest"], sum(record["GradVariance"]), record["MeanGSNR"]]


class Opacus(Tool):
    def setup(self):
        from opacus import GradSampleModule
        from opacus.validators import ModuleValidator

        fixed = ModuleValidator.fix(self.model)
        _copy_attention(self.model, fixed)
        self.module = GradSampleModule(fixed)
        self.model = self.module

    def per_sample_step(self, x, y):
        self.loss_fn(self.module(x), y).backward()
        params = [p for p in self.module.parameters() if p.requires_grad]
        stats = from_individual([p.grad_sample for p in params])
        for p in params:
            p.grad_sample = None
        return stats


def _copy_attention(model, fixed):
    """The weights of each ``nn.MultiheadAttention`` into the ``DPMultiheadAttention`` that
    ``ModuleValidator.fix`` put in its place (it builds them anew; the packed ``in_proj``
    becomes ``qlinear``, ``klinear``, ``vlinear``)."""
    replaced = dict(fixed.named_modules())
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.MultiheadAttention):
                new = replaced[name]
                for i, part in enumerate((new.qlinear, new.klinear, new.vlinear)):
                    rows = slice(i * module.embed_dim, (i + 1) * module.embed_dim)
                    part.weight.copy_(module.in_proj_weight[rows])
                    part.bias.copy_(module.in_proj_bias[rows])
                new.out_proj.load_state_dict(module.out_proj.state_dict())


class TorchFunc(Tool):
    def setup(self):
        from torch.func import functional_call, grad, vmap

        self.params = {n: p for n, p in self.model.named_parameters()}
        buffers = dict(self.model.named_buffers())

        def one(params, x, y):
            return self.loss_fn(functional_call(self.model, (params, buffers), (x[None],)), y[None])

        self.individual = vmap(grad(one), in_dims=(None, 0, 0))

    def per_sample_step(self, x, y):
        detached = {n: p.detach() for n, p in self.params.items()}
        individual = self.individual(detached, x, y)
        for name, p in self.params.items():
            p.grad = individual[name].mean(0)
        return from_individual(list(individual.values()))


class BackPACK(Tool):
    def setup(self):
        from backpack import extend

        self.model = extend(self.model)
        self.loss_fn = extend(nn.CrossEntropyLoss())

    def per_sample_step(self, x, y):
        from backpack import backpack
        from backpack.extensions import BatchL2Grad, SumGradSquared

        with backpack(BatchL2Grad(), SumGradSquared()):
            self.loss_fn(self.model(x), y).backward()
        params = list(self.model.parameters())
        b = x.shape[0]  # BackPACK's quantities are of the mean loss's terms: g̃_n = B ∇c_n
        sq_norms = b ** 2 * sum(p.batch_l2 for p in params)
        return statistics_of(b, sq_norms, [b * p.grad for p in params], [b ** 2 * p.sum_grad_squared for p in params])


TOOLS = {"cockpit-lite": Lite, "Opacus": Opacus, "torch.func": TorchFunc, "BackPACK": BackPACK}


def available(name, problem):
    """Why ``name`` cannot run ``problem`` (not installed, not supported), or ``None``."""
    module = {"Opacus": "opacus", "BackPACK": "backpack", "torch.func": None, "cockpit-lite": None}[name]
    if module is not None:
        try:
            __import__(module)
        except ImportError:
            return "not installed"
    if name == "BackPACK" and not PROBLEMS[problem][3]:
        return "unsupported"
    return None


def build(name, problem):
    """The tool, or the reason it cannot run (its error's first line)."""
    reason = available(name, problem)
    if reason is not None:
        return reason
    try:
        tool = TOOLS[name](problem)
        tool.check = tool.run_step()
        return tool
    except Exception as error:  # a peer that cannot serve this model
        return f"fails: {type(error).__name__}: {str(error).splitlines()[0][:80]}"


def relative_difference(values, reference):
    return max(abs(v - r) / max(abs(r), 1e-12) for v, r in zip(values, reference))


def measure(problem, repeats, steps, tools=tuple(TOOLS)):
    """``{tool: (median seconds per step or None, relative difference from cockpit-lite or reason)}``
    and the plain step's seconds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = {name: build(name, problem) for name in tools}
        plain = Plain(problem)
        runners = {"plain": plain, **{n: t for n, t in built.items() if isinstance(t, Tool)}}
        times = {name: [] for name in runners}
        for _ in range(repeats):
            for name, runner in runners.items():
                times[name].append(runner.time_steps(steps))
    reference = built["cockpit-lite"].check if isinstance(built.get("cockpit-lite"), Tool) else None
    results = {}
    for name, tool in built.items():
        if not isinstance(tool, Tool):
            results[name] = (None, tool)
            continue
        results[name] = (statistics.median(times[name]),
                         relative_difference(tool.check, reference) if reference is not None else None)
    return statistics.median(times["plain"]), results


def table(measured):
    names = [name for name in TOOLS if any(name in results for _, results in measured.values())]
    lines = ["| problem | plain step | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for problem, (plain, results) in measured.items():
        cells = []
        for name in names:
            seconds, check = results.get(name, (None, "–"))
            if seconds is None:
                cells.append(check)
            elif isinstance(check, float) and check > TOLERANCE:
                cells.append(f"{seconds / plain:.2f}× (differs: {check:.1e})")
            else:
                cells.append(f"{seconds / plain:.2f}×")
        lines.append(f"| {problem} | {plain * 1e3:.2f} ms | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    measured = {p: measure(p, args.repeats, args.steps) for p in args.problems}
    print(f"Step with the per-sample work / plain step (median of {args.repeats} interleaved rounds, "
          f"batch {BATCH}, 1 thread); 'differs': the tool's statistics are not cockpit-lite's\n")
    print(table(measured))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({p: {"plain_s": plain, "tools": {n: {"seconds": s, "check": c} for n, (s, c) in r.items()}}
                       for p, (plain, r) in measured.items()}, f, indent=1)
    return measured


if __name__ == "__main__":
    main()
