"""How much more memory does a tracked step take than a plain one, on large models?

Usage::

    python -m benchmarks.memory_peak [--steps 3] [--cells gpt2_small:8:sgd ...] [--json PATH]

Each cell (problem, batch size, optimizer) trains ``--steps`` steps in a fresh process per
configuration (plain; ``configuration("economy")`` at every step, exact; the same with
``samples=8``; one thread) and reads the growth of its peak resident set (``ru_maxrss``)
over the start of training (``benchmarks.memory_flatness.run``). The table gives each
growth and its ratio to the plain step's (the target: economy at most 1.5×).

Twice: with glibc's default allocator settings, and with ``MALLOC_MMAP_THRESHOLD_=131072``
(every block of 128 KiB or more mapped on its own and returned when freed). By default
glibc raises that threshold to the size of each large block freed (up to 32 MiB), and the
heap then keeps freed blocks below it: the peak resident set counts the heap's
fragmentation as well as the tensors alive at the peak. The fixed threshold leaves the
tensors alone (within a few MiB), so the two rows separate what the steps hold from
how the allocator places it.

Problems (``benchmarks.memory_flatness.PROBLEMS``): ``gpt2_small``, a GPT-2-small-like
nanoGPT-style model (``bench_per_sample.GPT`` with 4 blocks, d = 512, 8 heads, T = 128,
vocabulary 8192, tied head; 17M parameters) and ``transformer512``, ``bench_overhead``'s
encoder classifier with d = 512 (T = 32, 2 layers); random tokens.
"""

import argparse
import json

from benchmarks import memory_flatness

CELLS = ("gpt2_small:8:sgd", "gpt2_small:8:adamw", "gpt2_small:32:sgd", "transformer512:64:sgd")
CONFIGS = memory_flatness.CONFIGS
ALLOCATORS = {"default": {}, "fixed mmap threshold": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def measure(cells, steps, allocators=tuple(ALLOCATORS)):
    """``{(cell, allocator): {config: peak growth in bytes}}``."""
    results = {}
    for cell in cells:
        name, batch, optimizer = cell.split(":")
        for allocator in allocators:
            results[cell, allocator] = {
                config: memory_flatness.measure(name, config, steps, optimizer, int(batch),
                                                env=ALLOCATORS[allocator])["peak"]
                for config in CONFIGS
            }
    return results


def table(results):
    lines = ["| problem, batch, optimizer | allocator | " + " | ".join(CONFIGS) + " |",
             "|---|---|" + "---|" * len(CONFIGS)]
    for (cell, allocator), peaks in results.items():
        name, batch, optimizer = cell.split(":")
        plain = peaks["plain"]
        cells = [f"+{plain / 2**20:.0f} MiB"] + [  # no ratio to a plain step that grew nothing (a tiny model)
            f"+{peaks[c] / 2**20:.0f} MiB" + (f" ({peaks[c] / plain:.2f}×)" if plain > 0 else "") for c in CONFIGS[1:]]
        lines.append(f"| {name}, {batch}, {optimizer} | {allocator} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cells", nargs="+", default=list(CELLS), help="problem:batch:optimizer")
    parser.add_argument("--allocators", nargs="+", default=list(ALLOCATORS), choices=list(ALLOCATORS))
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    results = measure(args.cells, args.steps, args.allocators)
    print(f"Growth of the peak resident set over {args.steps} steps, fresh process per configuration, "
          "1 thread, every step tracked (ratio to the plain step's):\n")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"cell": c, "allocator": a, "peak": p} for (c, a), p in results.items()], f, indent=1)


if __name__ == "__main__":
    main()
