"""Overhead of tracking: step time and peak memory relative to a plain training step.

Usage::

    python -m experiments.bench_overhead [--repeats 5] [--steps 5] [--quick] [--json PATH]

For each problem (an MLP 784-64-10 and a small CNN on 3×32×32 inputs, batch 64,
cross-entropy, SGD) it times, in one process with one thread:

- the plain step (forward, backward, SGD step; no BackPACK),
- cockpit-lite at each level (economy, business, full), every step tracked,
- cockpit-lite with each quantity alone,
- the original Cockpit at each level, when ``cockpit-for-pytorch`` is installed.

Timings are medians over ``--repeats`` interleaved rounds (every configuration runs
once per round, so a load change on the machine hits all of them alike); a
round times ``--steps`` steps after one warm-up step. Ratios are to the plain step
of the same round set. Memory is the growth of the process's peak resident set
over 4 steps (from after building model, data and cockpit), in a fresh process
per configuration, in MiB: allocator reuse makes it coarse (±a few MiB), and a plain
step of these small models may need no new pages at all.
"""

import argparse
import json
import os
import subprocess
import sys
import statistics
import time
import warnings

import torch
from torch import nn

from cockpit_lite import Cockpit, configuration, extend, quantities
from cockpit_lite.utils.configuration import quantities_cls_for_configuration

BATCH = 64
LEVELS = ("economy", "business", "full")


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 10),
    )


PROBLEMS = {"mlp": (mlp, (1, 28, 28)), "cnn": (cnn, (3, 32, 32))}


class Runner:
    """One configuration: a model, its optimizer, data, and how a step is run."""

    def __init__(self, problem, make_cockpit=None, peer=False):
        build, shape = PROBLEMS[problem]
        torch.manual_seed(0)
        self.model, self.lossfunc = build(), nn.CrossEntropyLoss()
        if make_cockpit is not None:
            self.model, self.lossfunc = extend(self.model), extend(self.lossfunc)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.cp = make_cockpit(self.model) if make_cockpit is not None else None
        self.peer = peer
        g = torch.Generator().manual_seed(1)
        self.batches = [
            (torch.randn(BATCH, *shape, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(4)
        ]
        self.step = 0

    def run_step(self):
        x, y = self.batches[self.step % len(self.batches)]
        self.opt.zero_grad()
        outputs = self.model(x)
        loss = self.lossfunc(outputs, y)
        if self.cp is None:
            loss.backward()
        else:
            info = {"loss": loss, "optimizer": self.opt}
            if self.peer:
                info["batch_size"] = BATCH
                info["individual_losses"] = nn.functional.cross_entropy(outputs, y, reduction="none")
            with self.cp(self.step, info=info):
                loss.backward(create_graph=self.cp.create_graph(self.step))
        self.opt.step()
        self.step += 1

    def time_steps(self, steps):
        self.run_step()  # warm-up (and the first step of two-step quantities)
        start = time.perf_counter()
        for _ in range(steps):
            self.run_step()
        return (time.perf_counter() - start) / steps



def peak_memory(problem, name):
    """Extra peak resident memory (bytes) of 4 steps of configuration ``name``.

    Measured in a fresh process: the high-water mark of the resident set after the
    steps minus the one after building the model, optimizer, data and cockpit. On
    Linux it is the process's own ``VmHWM``: ``getrusage``'s ``ru_maxrss`` starts a
    child at its parent's resident set, which would hide the child's growth behind
    a large benchmark process.
    """
    code = (
        "import sys, warnings; warnings.simplefilter('ignore');"
        "from experiments import bench_overhead as b; import torch; torch.set_num_threads(1);"
        f"runner = b.configurations({problem!r}, True, {name.startswith('Cockpit')!r})[{name!r}]();"
        "base = b.high_water_mark();"
        "[runner.run_step() for _ in range(4)];"
        "print(b.high_water_mark() - base)"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return int(out.stdout.split()[-1])


def high_water_mark():
    """Peak resident set of this process in bytes (``VmHWM`` where ``/proc`` has it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def configurations(problem, with_quantities, with_peer):
    configs = {"plain": lambda: Runner(problem)}
    for level in LEVELS:
        configs[f"lite {level}"] = lambda level=level: Runner(
            problem, lambda m: Cockpit(m.parameters(), configuration(level))
        )
    if with_quantities:
        for cls in quantities_cls_for_configuration("full") + (
            quantities.EarlyStopping, quantities.CABS,
        ):
            configs[f"  {cls.__name__}"] = lambda cls=cls: Runner(
                problem, lambda m: Cockpit(m.parameters(), [cls()])
            )
    if with_peer:
        import cockpit
        from cockpit.utils.configuration import configuration as peer_configuration

        for level in LEVELS:
            configs[f"Cockpit {level}"] = lambda level=level: Runner(
                problem, lambda m: cockpit.Cockpit(m.parameters(), peer_configuration(level)), peer=True
            )
    return configs


def measure(problem, repeats, steps, with_quantities, with_peer):
    runners = {name: make() for name, make in configurations(problem, with_quantities, with_peer).items()}
    times = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            times[name].append(runner.time_steps(steps))
    medians = {name: statistics.median(t) for name, t in times.items()}
    memory = {name: peak_memory(problem, name) for name in runners if not name.startswith("  ")}
    return medians, memory


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats, 2 steps, no per-quantity rows")
    parser.add_argument("--no-peer", action="store_true", help="leave out the original Cockpit")
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS))
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.steps = 2, 2
    torch.set_num_threads(1)
    with_peer = False
    if not args.no_peer:
        try:
            import cockpit  # noqa: F401

            with_peer = True
        except ImportError:
            print("cockpit-for-pytorch is not installed: the original Cockpit is left out")
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for problem in args.problems:
            medians, memory = measure(problem, args.repeats, args.steps, not args.quick, with_peer)
            results[problem] = {"median_step_s": medians, "peak_memory_bytes": memory}
    print(f"step time / plain step time (median of {args.repeats} interleaved rounds of "
          f"{args.steps} steps, batch {BATCH}, 1 thread)")
    names = list(next(iter(results.values()))["median_step_s"])
    print(f"{'configuration':<22}" + "".join(f"{p + ' time':>12}{p + ' +MiB':>10}" for p in results))
    for name in names:
        row = f"{name:<22}"
        for problem, r in results.items():
            ratio = r["median_step_s"][name] / r["median_step_s"]["plain"]
            mem = r["peak_memory_bytes"].get(name)
            row += f"{ratio:>11.2f}x" + (f"{mem / 2**20:>10.1f}" if mem is not None else f"{'':>10}")
        print(row)
    print("+MiB: growth of the process's peak resident memory over 4 steps (fresh process)")
    for problem, r in results.items():
        print(f"plain {problem} step: {r['median_step_s']['plain'] * 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
