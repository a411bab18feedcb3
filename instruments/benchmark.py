"""Measure what ``EpochPlotter`` costs a training loop: ``python -m instruments.benchmark RUN.jsonl``.

For each mode (``sync``, ``thread``, ``process``) a simulated training loop runs
``epochs`` x ``steps`` steps and calls ``EpochPlotter.plot`` once per epoch. Reported
per mode:

- ``blocked_mean_s`` / ``blocked_max_s``: seconds one ``plot`` call held the loop
  (snapshot + queueing; in ``sync`` mode the whole render);
- ``render_mean_s``: seconds one dashboard took to render (in the background);
- ``loop_slowdown``: the loop's wall time relative to the same loop without any
  plotting, run right before it (paired, so machine load drifts cancel). It shows
  the contention for the interpreter lock (thread mode) or for CPU cores.

The simulated step is kernel-like by default (numpy ufuncs on a large array, one
thread, releasing the interpreter lock, like torch ops) or Python-bound with
``--python`` (holding the lock, like a data pipeline written in Python).
``--scale-steps N`` replicates the record to N steps to see how the snapshot cost
grows with the length of a run.
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np

from . import data
from .epoch import EpochPlotter, _ProcessRenderer


def python_step(n=20000):
    """A Python-bound stand-in for a training step (holds the interpreter lock)."""
    total = 0.0
    for i in range(n):
        total += (i % 7) * 0.5
    return total


_BUFFER = np.linspace(0.0, 1.0, 400_000)


def kernel_step():
    """A kernel-bound stand-in for a training step (single-threaded ufuncs, lock released)."""
    out = _BUFFER
    for _ in range(6):
        out = np.tanh(out * 1.0001)
    return out


def benchmark(run, savedir, epochs=3, steps_per_epoch=100, modes=("sync", "thread", "process"), step=kernel_step,
              **dashboard_options):
    """Return ``{mode: measurements}`` (see the module docstring)."""
    results = {}
    for mode in modes:
        start = time.perf_counter()
        for _ in range(epochs * steps_per_epoch):
            step()
        baseline = time.perf_counter() - start

        plotter = EpochPlotter(savedir, savename=f"bench_{mode}", mode=mode, **dashboard_options)
        if mode == "process":  # a long run starts the worker once; keep its start-up out of the loop
            plotter._ensure_worker()
            plotter._renderer = _ProcessRenderer()
            plotter._renderer.ready()
        start = time.perf_counter()
        for epoch in range(epochs):
            for _ in range(steps_per_epoch):
                step()
            plotter.plot(run, epoch=epoch)
        loop = time.perf_counter() - start
        plotter.close()
        summary = plotter.summary()
        summary.update({"loop_s": round(loop, 3), "baseline_loop_s": round(baseline, 3),
                        "loop_slowdown": round(loop / baseline, 3),
                        "drain_s": round(time.perf_counter() - start - loop, 3)})
        results[mode] = summary
    return results


def replicate(run, n_steps):
    """A run with ``n_steps`` steps made by repeating ``run``'s steps (for snapshot scaling)."""
    steps = sorted(run.record)
    record = {i: run.record[steps[i % len(steps)]] for i in range(n_steps)}
    return data.Run(record, run.params, run.name)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m instruments.benchmark", description=__doc__.split("\n")[0])
    parser.add_argument("log", help="a log to render (.jsonl/.json)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="simulated steps per epoch")
    parser.add_argument("--python", action="store_true", help="Python-bound steps instead of kernels")
    parser.add_argument("--modes", nargs="+", default=["sync", "thread", "process"])
    parser.add_argument("--scale-steps", type=int, nargs="+", default=[],
                        help="also time the snapshot of the record replicated to these step counts")
    args = parser.parse_args(argv)
    run = data.load(args.log)
    with tempfile.TemporaryDirectory() as folder:
        results = benchmark(run, folder, epochs=args.epochs, steps_per_epoch=args.steps, modes=args.modes,
                            step=python_step if args.python else kernel_step)
    for n in args.scale_steps:
        big = replicate(run, n)
        plotter = EpochPlotter(".", mode="thread")
        start = time.perf_counter()
        plotter._snapshot(big)
        first = time.perf_counter() - start
        for i in range(n, n + n // 100 + 1):  # one more "epoch" of 1 % new steps
            big.record[i] = dict(big.record[i - n])
        start = time.perf_counter()
        plotter._snapshot(big)
        results[f"snapshot_{n}_steps_s"] = {"first": round(first, 5), "next": round(time.perf_counter() - start, 5)}
    results["cpu_count"] = os.cpu_count()
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
