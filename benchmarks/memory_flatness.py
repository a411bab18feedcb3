"""Does the resident memory of a long tracked run stay flat?

Usage::

    python -m benchmarks.memory_flatness [--steps 200] [--problems transformer gpt] [--json PATH]

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

from benchmarks.bench_overhead import TransformerClassifier
from benchmarks.bench_per_sample import GPT, token_loss

CHECKPOINTS = (1, 10, 50, 100, 200)
CONFIGS = ("plain", "economy", "economy, samples=8")


PROBLEMS = {
    # name: (model builder, vocabulary, sequence length, default batch size, language model)
    "transformer": (lambda: TransformerClassifier(d=128, length=64), 100, 64, 64, False),
    "gpt": (lambda: GPT(vocab=512, d=128, length=64, blocks=4), 512, 64, 16, True),
    "gpt2_small": (lambda: GPT(vocab=8192, d=512, length=128, blocks=4, heads=8), 8192, 128, 8, True),
    "transformer512": (lambda: TransformerClassifier(d=512, length=32), 100, 32, 64, False),
}
"""``gpt2_small`` and ``transformer512`` are ``benchmarks.memory_peak``'s."""

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1),
}


def problem(name, generator, batch_size=None):
    """``(model, loss of (outputs, targets), batch maker)``; random tokens."""
    build, vocab, length, default, language_model = PROBLEMS[name]
    size = batch_size or default

    def batch():
        if language_model:
            ids = torch.randint(0, vocab, (size, length + 1), generator=generator)
            return ids[:, :-1], ids[:, 1:]
        return (torch.randint(0, vocab, (size, length), generator=generator),
                torch.randint(0, 10, (size,), generator=generator))

    return build(), token_loss if language_model else nn.functional.cross_entropy, batch


def resident():
    """This process's resident set in bytes (``VmRSS``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS in /proc/self/status")


def run(name, config, steps, optimizer="sgd", batch_size=None):
    """One configuration's resident set before training and after each checkpoint step, and the
    growth of its peak resident set (``ru_maxrss``) over training: ``{"rss": {step: bytes},
    "peak": bytes}``."""
    import resource
    import warnings

    from cockpit_lite import Cockpit, configuration

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, loss_fn, batch = problem(name, torch.Generator().manual_seed(1), batch_size)
    opt = OPTIMIZERS[optimizer](model.parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cp = None
    if config != "plain":
        samples = 8 if "samples" in config else None
        cp = Cockpit(model, configuration("economy"), diagnose=False, samples=samples)
    rss = {0: resident()}
    for step in range(1, steps + 1):
        x, y = batch()
        opt.zero_grad()
        backward(cp, step, loss_fn(model(x), y), opt)
        opt.step()
        if step in CHECKPOINTS or step == steps:
            rss[step] = resident()
    return {"rss": rss, "peak": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024}


def backward(cp, step, loss, optimizer):
    """``loss.backward()``: plain without a Cockpit (``cp=None``), else inside ``cp(step)``."""
    if cp is None:
        loss.backward()
        return
    with cp(step, info={"loss": loss, "optimizer": optimizer}):
        loss.backward()


def measure(name, config, steps, optimizer="sgd", batch_size=None, env=None):
    """``run`` in a fresh process (with ``env`` added to its environment)."""
    code = ("import json; from benchmarks import memory_flatness as m; "
            f"print(json.dumps(m.run({name!r}, {config!r}, {steps}, {optimizer!r}, {batch_size!r})))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.splitlines()[-1])
    return {"rss": {int(k): v for k, v in result["rss"].items()}, "peak": result["peak"]}


def table(results, steps):
    marks = [s for s in CHECKPOINTS if s <= steps] + ([steps] if steps not in CHECKPOINTS else [])
    lines = ["| problem | configuration | " + " | ".join(f"step {s}" for s in marks) + f" | RSS step {steps} / step {min(10, steps)} |",
             "|---|---|" + "---|" * (len(marks) + 1)]
    for (name, config), result in results.items():
        rss = result["rss"]
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
            json.dump([{"problem": n, "config": c, "rss": r["rss"]} for (n, c), r in results.items()], f, indent=1)


if __name__ == "__main__":
    main()
