"""Cost of cockpit-lite under DistributedDataParallel: 2 CPU processes (gloo), one thread each.

Usage::

    python -m benchmarks.bench_ddp [--steps 20] [--repeats 5]

Times the DDP training step (forward, backward with DDP's all-reduce, SGD step) of the
benchmark MLP (784-64-10, 32 samples per rank) without a Cockpit, with a Cockpit where
nothing is due, with the default ``Cockpit(model)`` (the diagnosis alone: its signals at
the first 10 steps, then at every 10th, so the timed rounds after the first are its steady
state), and with ``economy`` at every step, interleaved, and prints the
ratios to the plain DDP step (medians over the repeats, as rank 0 measured them),
plus the number of values the Cockpit's collectives move per step.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from cockpit_lite import Cockpit, configuration, schedules

PER_RANK = 32


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))


def _worker(rank, world, path, steps, repeats, out):
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    configs = {  # name -> the Cockpit's arguments
        "plain": None,
        "nothing due": lambda: dict(quantities=configuration(
            "economy", track_schedule=schedules.linear(10**9, offset=10**9)), diagnose=False),
        "default": dict,  # Cockpit(model): the diagnosis alone
        "economy": lambda: dict(quantities=configuration("economy"), diagnose=False),
    }
    runners = {}
    for name, make in configs.items():
        model = nn.parallel.DistributedDataParallel(_model())
        cp = None if make is None else Cockpit(model, **make())
        runners[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01), cp)
    g = torch.Generator().manual_seed(rank)
    data = [(torch.randn(PER_RANK, 1, 28, 28, generator=g), torch.randint(0, 10, (PER_RANK,), generator=g)) for _ in range(4)]
    counters = {name: 0 for name in runners}

    def run(name):
        model, opt, cp = runners[name]
        x, y = data[counters[name] % 4]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if cp is None:
            loss.backward()
        else:
            with cp(counters[name], info={"loss": loss, "optimizer": opt}):
                loss.backward()
        opt.step()
        counters[name] += 1

    times = {name: [] for name in runners}
    for _ in range(repeats):
        for name in runners:
            run(name)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                run(name)
            dist.barrier()
            times[name].append((time.perf_counter() - start) / steps)
    if rank == 0:
        medians = {name: statistics.median(t) for name, t in times.items()}
        params = sum(p.numel() for p in _model().parameters())
        with open(out, "w") as file:
            file.write(f"DDP step time / plain DDP step ({world} processes, gloo, {PER_RANK} samples per rank, 1 thread each)\n")
            for name, t in medians.items():
                file.write(f"{name:<12} {t * 1e3:8.2f} ms  {t / medians['plain']:6.2f}x\n")
            file.write(
                f"collectives per tracked step: all-reduce of {params} gradient values + {world} sizes; "
                "all-reduce of the additive results; all-gather of the per-sample results\n"
            )
    dist.destroy_process_group()
    os._exit(0)  # skip the interpreter's teardown, where gloo's threads sometimes abort after the work is done


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.txt")
        mp.spawn(_worker, args=(2, os.path.join(folder, "pg"), args.steps, args.repeats, out), nprocs=2, join=True)
        with open(out) as file:
            print(file.read(), end="")


if __name__ == "__main__":
    main()
