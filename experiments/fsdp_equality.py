"""Statistics of a model sharded by FSDP2 against one process on the whole batch (CPU, gloo, float64).

Usage::

    python -m experiments.fsdp_equality [--world 2 4] [--steps 5] [--json PATH] [--curvature]

For each model (``MODELS``: an MLP, a GPT-like transformer with causal self-attention, learned
positions and LayerNorm, an MLP with LayerNorm), optimizer (SGD with momentum, AdamW) and world
size, ``W`` processes train the model with every layer and the root ``fully_shard``-ed, each on
its part of the global batch, with ``Cockpit(model, configuration("economy", extras=True) +
[GradHist2d(adapt=(GradAbsMax(None), ParamAbsMax(None)))])`` (the diagnosis on; the range moves to
the largest individual-gradient and parameter elements every step); one process trains the same model, unsharded, on
the whole batch with the same Cockpit. The table gives, per quantity, the largest relative
difference over all steps, layers and elements (histogram counts: the largest count difference);
``flags`` and ``findings`` must be the same strings. One set of processes per world size runs
every case (starting them costs more than the training). ``--curvature``: the curvature quantities
(``CURVATURE``) under FSDP2 and under DDP against one process, with SGD and momentum.

``run_cases`` and ``compare`` are what ``tests/test_sharded.py`` runs on its own cases.
"""

import argparse
import importlib
import json
import math
import os
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from cockpit_lite import Cockpit, configuration, quantities
from cockpit_lite.quantities.bin_adaptation import GradAbsMax, ParamAbsMax

SEQ, VOCAB, BATCH = 6, 11, 8


class SelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, heads=2):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), SelfAttention(d, heads), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token embedding, learned positions (a bare parameter of the root), pre-norm blocks, head."""

    def __init__(self, d=8, layers=2, vocab=VOCAB, seq=SEQ, heads=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def layers(self):
        return list(self.blocks)


def _mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _mlp_layernorm():
    return nn.Sequential(nn.Linear(6, 12), nn.LayerNorm(12), nn.ReLU(), nn.Linear(12, 12), nn.LayerNorm(12),
                         nn.Tanh(), nn.Linear(12, 3))


def _features(g, b):
    return torch.randn(b, 6, generator=g, dtype=torch.float64)


def _classes(g, b):
    return torch.randint(0, 3, (b,), generator=g)


def _tokens(g, b):
    return torch.randint(0, VOCAB, (b, SEQ), generator=g)


def token_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


MODELS = {  # name -> (builder, input maker, target maker, loss)
    "mlp": (_mlp, _features, _classes, F.cross_entropy),
    "transformer": (GPT, _tokens, _tokens, token_loss),
    "mlp_layernorm": (_mlp_layernorm, _features, _classes, F.cross_entropy),
}

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
}


def layers(model):
    """The modules ``fully_shard``-ed one by one ("per layer"): a model's ``layers()``, else its
    children that hold parameters and share none with another child (FSDP2 keeps a tied pair in one
    group: the root's)."""
    if hasattr(model, "layers"):
        return model.layers()
    children = [child for child in model.children() if any(True for _ in child.parameters())]
    owners = {}
    for child in children:
        for param in child.parameters():
            owners.setdefault(id(param), set()).add(child)
    return [c for c in children if all(len(owners[id(p)]) == 1 for p in c.parameters())]


def shard(model, how, param_dtype=None, group=None):
    """``fully_shard`` the model: ``"layers"`` every layer, then the root; ``"mixed"`` the first
    layer only, then the root (which takes the rest); with ``param_dtype``, FSDP2's mixed
    precision (``MixedPrecisionPolicy(param_dtype=...)``); ``"ddp"``: no sharding, the model
    wrapped in ``DistributedDataParallel``. Over the ranks of ``group`` (a process group), else
    over every rank. Returns the module to run and track."""
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    options = {} if param_dtype is None else {"mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype)}
    if group is not None:
        options["mesh"] = DeviceMesh.from_group(group, "cpu")
    chosen = layers(model)
    for layer in chosen if how == "layers" else chosen[:1]:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def tracked(optimizer):
    """The quantities compared: every first-order one (``CABS`` and ``EarlyStopping`` are defined
    for plain SGD only)."""
    plain = [quantities.CABS(), quantities.EarlyStopping()] if optimizer == "sgd" else []
    adapted = quantities.GradHist2d(adapt=(GradAbsMax(None), ParamAbsMax(None)))  # maxima over the ranks' samples
    return configuration("economy", extras=True) + [adapted] + plain


@dataclass
class Case:
    model: str
    optimizer: str = "sgd_momentum"
    sharding: str = "layers"  # ``shard``'s ``how``
    shards: tuple = ()  # samples per rank (default: BATCH split evenly)
    steps: int = 5
    options: dict = field(default_factory=dict)  # more Cockpit(...) arguments
    source: str = None  # "module:name" of a dict like MODELS that holds the model (default: MODELS)
    more: tuple = ()  # more quantities to track: names in ``cockpit_lite.quantities``, or (name, {arguments})
    dtype: str = "float64"  # the model's
    param_dtype: str = None  # FSDP2's mixed precision: the dtype of the unsharded parameters
    meshes: tuple = ()  # the ranks of each mesh, each training its own model on the whole batch (default: one of all)


def _entry(case):
    if case.source is None:
        return MODELS[case.model]
    module, name = case.source.split(":")
    return getattr(importlib.import_module(module), name)[case.model]


def batches(case, total):
    _, inputs, targets, _ = _entry(case)
    g = torch.Generator().manual_seed(3)
    return [(inputs(g, total), targets(g, total)) for _ in range(case.steps)]


def train(case, rank=None, world=1):
    """Train ``case`` with a Cockpit: as rank ``rank`` of ``world`` on its shard (sharded), or
    (``rank=None``) in one process on the whole batch. With ``case.meshes``, the rank's mesh is
    the world: its ranks shard the model and split the whole batch. Returns ``(record, findings)``."""
    build, _, _, loss_fn = _entry(case)
    group = None
    if rank is not None and case.meshes:
        groups = [dist.new_group(list(ranks)) for ranks in case.meshes]  # (every rank makes every group)
        mine = next(i for i, ranks in enumerate(case.meshes) if rank in ranks)
        group, rank, world = groups[mine], case.meshes[mine].index(rank), len(case.meshes[mine])
    shards = case.shards or (BATCH // world,) * world
    total = sum(shards)
    torch.manual_seed(0)
    model = build().to(getattr(torch, case.dtype))
    if rank is not None:
        model = shard(model, case.sharding, case.param_dtype and getattr(torch, case.param_dtype), group)
    opt = OPTIMIZERS[case.optimizer](model.parameters())
    more = [getattr(quantities, name)(**arguments) for name, arguments in
            ((entry, {}) if isinstance(entry, str) else entry for entry in case.more)]
    cp = Cockpit(model, tracked(case.optimizer) + more, **case.options)
    start = 0 if rank is None else sum(shards[:rank])
    size = total if rank is None else shards[rank]
    for step, (x, y) in enumerate(batches(case, total)):
        x, y = x[start:start + size], y[start:start + size]
        x = x.to(getattr(torch, case.dtype)) if x.is_floating_point() else x
        opt.zero_grad()
        share = 1.0 if rank is None else size * world / total  # FSDP averages the ranks: the rank's share
        loss = loss_fn(model(x), y) * share
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    cp.close()
    return cp.get_output(), [f.to_dict() for f in cp.findings]


def _worker(rank, world, cases, path, extra):
    dist.init_process_group("gloo", init_method=f"file://{path}.pg", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        results = {}
        for name, case in cases.items():
            try:
                results[name] = train(case, rank, world)
            except Exception as error:  # reported by rank 0, the others' too
                results[name] = f"{type(error).__name__}: {error}"
                raise
        if extra is not None:
            results["_checks"] = extra(rank, world).run()
        with open(f"{path}.{rank}", "wb") as file:
            pickle.dump(results, file)
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads sometimes abort in the interpreter's teardown, after all work


def run_cases(cases, world, extra=None, directory=None, seconds=None):
    """``{case name: ((record, findings) of rank 0, [record of every rank])}`` of ``world`` processes;
    with ``extra`` (a class: ``extra(rank, world).run()`` after the cases, in the same processes),
    also ``"_checks"``: every rank's result of it. With ``seconds``, ``RuntimeError`` if the processes have
    not finished by then (ranks whose collectives do not match wait for each other forever)."""
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = os.path.join(tmp, "results")
        context = mp.spawn(_worker, args=(world, cases, path, extra), nprocs=world, join=False)
        deadline = math.inf if seconds is None else time.monotonic() + seconds
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise RuntimeError(f"the {world} ranks did not finish in {seconds} s: their collectives did not match")
        ranks = []
        for rank in range(world):
            with open(f"{path}.{rank}", "rb") as file:
                ranks.append(pickle.load(file))
    results = {name: (ranks[0][name], [r[name][0] for r in ranks]) for name in cases}
    if extra is not None:
        results["_checks"] = [r["_checks"] for r in ranks]
    return results


def flatten(value, prefix=""):
    """``(path, leaf)`` of every leaf of a record's nested dicts and lists (``/key``, ``[index]``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(item, f"{prefix}/{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from flatten(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def _quantity(key):
    """The quantity a flattened key belongs to (``/layers/GradNorm[2]`` -> ``GradNorm``)."""
    parts = key.strip("/").split("/")
    name = parts[1] if parts[0] in ("layers", "meta") and len(parts) > 1 else parts[0]
    return name.split("[")[0]


def histograms_agree(got, expected):
    """Whether two histograms' counts are equal once the two bins around 0 of every axis are taken as
    one (the ranges compared are symmetric about 0 with an even number of bins: 0 is an edge): gradients
    that are zero in exact arithmetic (an attention key bias) come out ±1e-18 in one summation order and
    ∓1e-18 in another, and so do the parameters they leave at 0 (a zero-initialised bias)."""
    def merged(counts):
        for axis, size in enumerate(counts.shape):
            middle = np.take(counts, [size // 2 - 1, size // 2], axis=axis).sum(axis=axis, keepdims=True)
            counts = np.concatenate([np.take(counts, range(size // 2 - 1), axis=axis), middle,
                                     np.take(counts, range(size // 2 + 1, size), axis=axis)], axis=axis)
        return counts
    got, expected = np.asarray(got), np.asarray(expected)
    return got.shape == expected.shape and np.array_equal(merged(got), merged(expected))


def compare(single, sharded):
    """``({quantity: largest relative difference}, [problems])`` of two records; NaN where both are NaN
    is equal. Histogram counts (``"... (counts)"``: how many elements moved to another bin) may differ
    only between the two bins next to an edge at 0 (``histograms_agree``), as under DDP
    (``tests/test_distributed.py``)."""
    (record, findings), (other, other_findings) = single, sharded
    problems, worst = [], {}
    if sorted(record) != sorted(other):
        problems.append(f"steps {sorted(record)} against {sorted(other)}")
    if findings != other_findings:
        problems.append(f"findings differ: {findings} against {other_findings}")
    for step in record:
        expected = dict(flatten({k: v for k, v in record[step].items() if k != "Time"}))
        got = dict(flatten({k: v for k, v in other.get(step, {}).items() if k != "Time"}))
        if sorted(expected) != sorted(got):
            problems.append(f"step {step}: keys {sorted(set(expected) ^ set(got))} on one side only")
        for key, value in expected.items():
            if key not in got:
                continue
            mine = got[key]
            if isinstance(value, (str, bool)) or value is None:
                if mine != value:
                    problems.append(f"step {step} {key}: {mine!r} against {value!r}")
                continue
            a, b = np.asarray(mine, dtype=float), np.asarray(value, dtype=float)
            if a.shape != b.shape:
                problems.append(f"step {step} {key}: shape {a.shape} against {b.shape}")
                continue
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                problems.append(f"step {step} {key}: NaN in one only")
                continue
            finite = ~np.isnan(b)
            if key.endswith("/hist"):
                moved = a - b
                if not histograms_agree(a, b):
                    problems.append(f"step {step} {key}: counts differ away from the bins around 0")
                error = float(np.abs(moved).sum() / 2)
            else:
                scale = np.maximum(np.abs(b[finite]), 1e-300)
                with np.errstate(invalid="ignore"):  # (inf against inf: equal)
                    error = float(np.nan_to_num(np.abs(a[finite] - b[finite]) / scale).max(initial=0.0))
            name = _quantity(key) + (" (counts)" if key.endswith("/hist") else "")
            worst[name] = max(worst.get(name, 0.0), error)
    return worst, problems


def measure(world_sizes, steps):
    """``{(model, optimizer, W): {quantity: largest relative difference}}`` and the problems found."""
    table, problems = {}, []
    for world in world_sizes:
        cases = {f"{m}/{o}": Case(m, o, steps=steps) for m in MODELS for o in ("sgd_momentum", "adamw")}
        results = run_cases(cases, world)
        for name, case in cases.items():
            worst, found = compare(train(case), results[name][0])
            table[case.model, case.optimizer, world] = worst
            problems += [f"{name}, W={world}: {p}" for p in found]
    return table, problems


CURVATURE = ("HessTrace", "HessMaxEV", ("TICDiag", {"max_passes": 100}), ("TICTrace", {"max_passes": 100}))
"""The curvature quantities of ``--curvature``: Hutchinson's ``HessTrace`` and ``HessMaxEV``'s Lanczos
from Hessian-vector products averaged over the ranks, the TICs from the engine's exact GGN diagonal
(``max_passes`` raised for the transformer's 60 passes)."""


def measure_curvature(world_sizes, steps):
    """``{(model, parallel, W): {quantity: largest relative difference}}`` of ``CURVATURE`` (with
    ``economy``), FSDP2 (every layer and the root sharded) and DDP, SGD with momentum, and the
    problems found."""
    table, problems = {}, []
    for world in world_sizes:
        cases = {f"{m}/{how}": Case(m, "sgd_momentum", sharding=how, steps=steps, options={"diagnose": False},
                                    more=CURVATURE) for m in MODELS for how in ("layers", "ddp")}
        results = run_cases(cases, world)
        for name, case in cases.items():
            single = train(case)
            worst, found = compare(single, results[name][0])
            products = [entry["meta"]["HessMaxEV"]["products"] for entry in single[0].values()]
            passes = [entry["meta"]["TICDiag"]["passes"] for entry in single[0].values()]
            worst["products"], worst["passes"] = sum(products) / len(products), passes[0]
            table[case.model, "FSDP2" if case.sharding == "layers" else "DDP", world] = worst
            problems += [f"{name}, W={world}: {p}" for p in found]
    return table, problems


def format_table(table):
    names = sorted({q for worst in table.values() for q in worst})
    lines = ["| model | setting | W | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for (model, setting, world), worst in table.items():
        cells = [("–" if q not in worst else f"{worst[q]:g}" if q in ("products", "passes") else f"{worst[q]:.1e}")
                 for q in names]
        lines.append(f"| {model} | {setting} | {world} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--curvature", action="store_true", help="the curvature quantities (CURVATURE), FSDP2 and DDP")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    table, problems = (measure_curvature if args.curvature else measure)(args.world, args.steps)
    if args.curvature:
        table = {key: {q: e for q, e in worst.items() if q in ("HessTrace", "HessMaxEV", "TICDiag", "TICTrace",
                                                                "products", "passes")} for key, worst in table.items()}
    print(format_table(table))
    worst = max((e for w in table.values() for q, e in w.items() if "counts" not in q and q not in ("products", "passes")),
                default=0.0)
    print(f"\nlargest relative difference: {worst:.2e}; problems: {len(problems)}")
    for problem in problems:
        print("  " + problem)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"table": {"/".join(map(str, k)): v for k, v in table.items()}, "problems": problems}, file,
                      indent=1)
    return table, problems


if __name__ == "__main__":
    main()
