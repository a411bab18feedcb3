"""Does the resident memory of a long tracked run stay flat?

Usage::

    python -m experiments.memory_flatness [--steps 200] [--problems transformer gpt] [--json PATH]

For each problem and configuration (plain; ``configuration("economy")`` tracked at every
step, exact; the same with ``samples=8``), a fresh process trains ``--steps`` steps (one
thread, SGD) and reads its resident set (``VmRSS``) before the first step and after steps
1, 10, 50, 100, 200. The table gives the growth over the start in MiB and the ratio of
the resident set after the last step to that after step 10 (the target: within 10 %).

Problems: ``transformer``, ``bench_overhead``'s encoder classifier with d = 128, T = 64
(embedding, learned positions, 2 layers, 4 heads; batch 64) and ``gpt``, a nanoGPT-style causal language model
(``bench_per_sample.GPT`` with 4 pre-norm blocks, d = 128, T = 64, vocabulary 512, tied
head; batch 16); random tokens.
"""

import argparse
import json
import os
import subprocess
import sys

import torch
from torch import nn

from experiments.bench_overhead import TransformerClassifier
from experiments.bench_per_sample import GPT, token_loss

CHECKPOINTS = (1, 10, 50, 100, 200)
CONFIGS = ("plain", "economy", "economy, samples=8")


def problem(name, generator):
    """``(model, loss of (outputs, targets), batch maker)``."""
    if name == "transformer":
        def batch():
            return torch.randint(0, 100, (64, 64), generator=generator), torch.randint(0, 10, (64,), generator=generator)
        return TransformerClassifier(d=128, length=64), nn.functional.cross_entropy, batch

    def batch():
        ids = torch.randint(0, 512, (16, 65), generator=generator)
        return ids[:, :-1], ids[:, 1:]

    return GPT(vocab=512, d=128, length=64, blocks=4), token_loss, batch


def resident():
    """This process's resident set in bytes (``VmRSS``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS in /proc/self/status")


def run(name, config, steps):
    """Resident set before training and after each checkpoint step of one configuration."""
    import warnings

    from cockpit_lite import Cockpit, configuration

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, loss_fn, batch = problem(name, torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cp = None
    if config != "plain":
        samples = 8 if "samples" in config else None
        cp = Cockpit(model, configuration("economy"), diagnose=False, samples=samples)
    rss = {0: resident()}
    for step in range(1, steps + 1):
        x, y = batch()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if cp is None:
            loss.backward()
        else:
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
        opt.step()
        if step in CHECKPOINTS or step == steps:
            rss[step] = resident()
    return rss


def measure(name, config, steps):
    """``run`` in a fresh process."""
    code = ("import json; from experiments import memory_flatness as m; "
            f"print(json.dumps(m.run({name!r}, {config!r}, {steps})))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return {int(k): v for k, v in json.loads(out.stdout.splitlines()[-1]).items()}


def table(results, steps):
    marks = [s for s in CHECKPOINTS if s <= steps] + ([steps] if steps not in CHECKPOINTS else [])
    lines = ["| problem | configuration | " + " | ".join(f"step {s}" for s in marks) + f" | RSS step {steps} / step {min(10, steps)} |",
             "|---|---|" + "---|" * (len(marks) + 1)]
    for (name, config), rss in results.items():
        growth = " | ".join(f"+{(rss[s] - rss[0]) / 2**20:.0f}" for s in marks)
        ratio = rss[steps] / rss[min(10, steps)]
        lines.append(f"| {name} | {config} | {growth} | {ratio:.3f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--problems", nargs="+", default=["transformer", "gpt"])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    results = {(name, config): measure(name, config, args.steps) for name in args.problems for config in args.configs}
    print(f"Growth of the resident set (MiB) over the start of training, fresh process per configuration, "
          f"1 thread, every step tracked:\n")
    print(table(results, args.steps))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"problem": n, "config": c, "rss": r} for (n, c), r in results.items()], f, indent=1)


if __name__ == "__main__":
    main()
