"""Per-rank peak memory of a tracked step on a model sharded by FSDP2, against the sharded plain step.

Usage::

    python -m benchmarks.fsdp_memory [--world 2] [--steps 3] [--cells gpt4:8 ...] [--json PATH]

Each cell (problem, samples per rank) trains ``--steps`` SGD steps on ``W`` CPU processes (gloo,
one thread each), every block and the root ``fully_shard``-ed, once without a Cockpit and once
with ``Cockpit(model, configuration("economy"), diagnose=False)`` tracking every step, each in
fresh processes. Every rank reads the growth of its peak resident set (``ru_maxrss``) over the
start of training (after the model is built and sharded); the table gives each rank's growths
and their ratio (the target: economy at most 1.5× the plain step's). As in
``benchmarks.memory_peak``, glibc's ``MALLOC_MMAP_THRESHOLD_=131072`` makes every block of
128 KiB or more its own mapping, returned when freed, so that the resident set follows the
tensors alive rather than the heap's fragmentation (``--default-allocator``: glibc's defaults).

Problems: ``gpt4``, ``fsdp_equality.GPT`` with 4 blocks, d = 512, 8 heads, T = 128, vocabulary
1024 and an untied head (13M parameters); ``gpt2_small``, ``memory_flatness``'s (4 blocks,
d = 512, T = 128, vocabulary 8192, tied head; 17M parameters), whose tied embedding and head sum
their two uses' individual gradients per sample (``B × 8192 × 512``, in one process as well).
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks import memory_flatness
from benchmarks.bench_per_sample import token_loss
from experiments.fsdp_equality import GPT

PROBLEMS = {  # name: (builder, vocabulary, sequence length, the modules sharded one by one)
    "gpt4": (lambda: GPT(d=512, layers=4, vocab=1024, seq=128, heads=8), 1024, 128, lambda m: list(m.blocks)),
    "gpt2_small": (memory_flatness.PROBLEMS["gpt2_small"][0], 8192, 128, lambda m: list(m.blocks)),
    "gpt_tiny": (lambda: GPT(d=16, layers=2, vocab=32, seq=8, heads=2), 32, 8, lambda m: list(m.blocks)),  # (tests)
}
CELLS = ("gpt4:8", "gpt4:32", "gpt2_small:8")
CONFIGS = ("plain", "economy")
THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def _worker(rank, world, path, name, size, config, steps):
    from torch.distributed.fsdp import fully_shard

    from cockpit_lite import Cockpit, configuration

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=f"file://{path}.pg", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        build, vocab, length, layers = PROBLEMS[name]
        torch.manual_seed(0)
        model = build()
        for layer in layers(model):
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        cp = Cockpit(model, configuration("economy"), diagnose=False) if config == "economy" else None
        g = torch.Generator().manual_seed(rank)
        batches = [torch.randint(0, vocab, (size, length + 1), generator=g) for _ in range(steps)]
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for step, ids in enumerate(batches):
            opt.zero_grad()
            memory_flatness.backward(cp, step, token_loss(model(ids[:, :-1]), ids[:, 1:]), opt)
            opt.step()
        growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) * 1024
        with open(f"{path}.{rank}", "w") as file:
            json.dump(growth, file)
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def measure(cell, world, steps, env=THRESHOLD):
    """``{config: [growth of each rank's peak resident set, bytes]}`` of one cell."""
    name, size = cell.split(":")
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # (read by the new processes' allocator as it starts)
    try:
        results = {}
        for config in CONFIGS:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "growth")
                mp.spawn(_worker, args=(world, path, name, int(size), config, steps), nprocs=world, join=True)
                results[config] = []
                for rank in range(world):
                    with open(f"{path}.{rank}") as file:
                        results[config].append(json.load(file))
        return results
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def table(results):
    lines = ["| problem, samples per rank | rank | plain | economy (ratio) |", "|---|---|---|---|"]
    for cell, growth in results.items():
        name, size = cell.split(":")
        for rank, (plain, economy) in enumerate(zip(growth["plain"], growth["economy"])):
            ratio = f" ({economy / plain:.2f}×)" if plain > 0 else ""  # (no ratio to a step that grew nothing)
            lines.append(f"| {name}, {size} | {rank} | +{plain / 2**20:.0f} MiB | +{economy / 2**20:.0f} MiB{ratio} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cells", nargs="+", default=list(CELLS))
    parser.add_argument("--default-allocator", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    env = {} if args.default_allocator else THRESHOLD
    results = {cell: measure(cell, args.world, args.steps, env) for cell in args.cells}
    print(f"Growth of each rank's peak resident set over the start of training ({args.world} ranks, "
          f"{args.steps} SGD steps, every block and the root fully_shard-ed, "
          f"{'default allocator' if args.default_allocator else 'MALLOC_MMAP_THRESHOLD_=131072'}):\n")
    print(table(results))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)
    return results


if __name__ == "__main__":
    main()
