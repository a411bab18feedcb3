"""Step time of subsampled economy tracking on larger models than ``bench_overhead``'s.

Usage::

    python -m experiments.subsample_scale [--problems transformer transformer512 gpt2_small]
        [--batch-size B] [--repeats 3] [--steps 2] [--json PATH]

``bench_overhead``'s transformer has d = 64, where a layer's weight gradient is as cheap as the
bookkeeping around it. This times, in one process with one thread, the plain step (forward,
backward, SGD), ``configuration("economy")`` tracked at every step with ``samples=8`` and,
with ``--exact``, exactly, on ``benchmarks.memory_flatness``'s models: ``transformer`` (d = 128,
T = 64, batch 64), ``transformer512`` (d = 512, T = 32, batch 64), ``gpt2_small`` (a
nanoGPT-style causal language model, 4 blocks, d = 512, T = 128, vocabulary 8192, tied head)
and ``gpt`` (d = 128, T = 64), the language models at batch 32 (``BATCH_SIZES``: at
``memory_flatness``'s 8, ``samples=8`` would be exact), or ``--batch-size``; random tokens. Medians
over ``--repeats`` interleaved rounds of ``--steps`` steps after two warm-up steps, as ratios to
the plain step of the same rounds.
"""

import argparse
import json
import statistics
import time
import warnings

import torch

from benchmarks import memory_flatness

BATCH_SIZES = {"gpt2_small": 32, "gpt": 32}
"""Batch sizes other than ``memory_flatness``'s defaults: more samples than ``samples=8``."""


def batch_of(name, batch_size=None):
    """The batch size a problem runs at: ``batch_size``, else ``BATCH_SIZES``', else ``memory_flatness``'s."""
    return batch_size or BATCH_SIZES.get(name) or memory_flatness.PROBLEMS[name][3]


class Runner:
    """One configuration of one problem: its own model (same seed), optimizer and two batches."""

    def __init__(self, name, samples=None, tracked=True, batch_size=None):
        from cockpit_lite import Cockpit, configuration

        torch.manual_seed(0)
        batch_size = batch_of(name, batch_size)
        self.model, self.loss_fn, batch = memory_flatness.problem(name, torch.Generator().manual_seed(1), batch_size)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.cp = Cockpit(self.model, configuration("economy"), diagnose=False, samples=samples) if tracked else None
        self.batches = [batch() for _ in range(2)]
        self.step = 0

    def run_step(self):
        x, y = self.batches[self.step % len(self.batches)]
        self.opt.zero_grad()
        loss = self.loss_fn(self.model(x), y)
        if self.cp is None:
            loss.backward()
        else:
            with self.cp(self.step, info={"loss": loss, "optimizer": self.opt}):
                loss.backward()
        self.opt.step()
        self.step += 1

    def time_steps(self, steps):
        start = time.perf_counter()
        for _ in range(steps):
            self.run_step()
        return (time.perf_counter() - start) / steps


def measure(name, repeats=3, steps=2, exact=False, batch_size=None):
    """``{configuration: median seconds per step}`` of one problem, interleaved rounds."""
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    configs = {"plain": dict(tracked=False), "economy, samples=8": dict(samples=8)}
    if exact:
        configs["economy"] = {}
    runners = {config: Runner(name, batch_size=batch_size, **kwargs) for config, kwargs in configs.items()}
    for runner in runners.values():  # warm-up (and the first step of two-step quantities)
        runner.time_steps(2)
    times = {config: [] for config in runners}
    for _ in range(repeats):
        for config, runner in runners.items():
            times[config].append(runner.time_steps(steps))
    return {config: statistics.median(values) for config, values in times.items()}


def table(results, batch_size=None):
    configs = [c for c in ("economy", "economy, samples=8") if any(c in r for r in results.values())]
    lines = ["| problem | batch | plain step | " + " | ".join(configs) + " |", "|---|---|---|" + "---|" * len(configs)]
    for name, result in results.items():
        plain = result["plain"]
        cells = [f"{result[c] / plain:.2f}×" if c in result else "–" for c in configs]
        lines.append(f"| {name} | {batch_of(name, batch_size)} | {plain * 1e3:.0f} ms | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", nargs="+", default=["transformer", "transformer512", "gpt2_small"],
                        choices=sorted(memory_flatness.PROBLEMS))
    parser.add_argument("--batch-size", type=int, help="instead of each problem's default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--exact", action="store_true", help="also time exact economy tracking (slow on gpt2_small)")
    parser.add_argument("--json", help="also write the seconds per step to this JSON file")
    args = parser.parse_args(argv)
    results = {name: measure(name, args.repeats, args.steps, args.exact, args.batch_size) for name in args.problems}
    print(f"Step time over the plain step (median of {args.repeats} interleaved rounds of {args.steps} steps, "
          "1 thread, every step tracked):\n")
    print(table(results, args.batch_size))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
