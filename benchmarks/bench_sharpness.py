"""Does a sparse λ_max (edge of stability) fit the cost of the default diagnosis?

    python -m benchmarks.bench_sharpness [--problems mlp cnn] [--repeats 5] [--steps 200] [--numbers]

The target (DESIGN §7): the default ``Cockpit(model)``, untracked and tracked steps averaged,
costs ≤ 1.05× the plain step. ``edge_of_stability`` needs ``HessMaxEV``, which the default
does not track. This measures, interleaved and on one thread, per problem of
``benchmarks.bench_overhead``:

- the plain step, the default diagnosis (``Cockpit(model)``, whole periods of its schedule)
  and ``HessMaxEV`` tracked at every step, as ratios to the plain step (medians of
  ``--repeats`` rounds);
- ``--steps`` steps of the default diagnosis with ``HessMaxEV`` on ``SCHEDULE``, a
  logarithmic schedule (steps 0, 1, 2, 4, 6, 10, 17, 28, ... : 30 points per 6 decades),
  against the same steps plain: the average ratio, measured;

and extrapolates the average to longer runs: (default ratio) + k(N) (λ_max-step ratio − 1) / N,
with k(N) the schedule's points up to step N.
"""

import argparse
import statistics

import torch

from cockpit_lite import Cockpit, diagnosis, quantities, schedules
from benchmarks import bench_overhead as bench

SCHEDULE = schedules.logarithmic(0, 6, steps=30)
"""The sparse λ_max schedule considered: 30 log-spaced points over 10⁶ steps (and step 0)."""

HORIZONS = (1_000, 10_000, 100_000)


def points(n):
    """Steps of ``SCHEDULE`` below ``n``."""
    return sum(SCHEDULE(step) for step in range(n))


def measure(problem, repeats, steps):
    """Median ratios to the plain step: ``{"default", "hess_max_ev", "default + sparse"}``."""
    runners = {
        "plain": lambda: bench.Runner(problem),
        "default": lambda: bench.Runner(problem, lambda m: Cockpit(m), backpack=False, period=diagnosis.EVERY,
                                        skip=diagnosis.DENSE_STEPS),
        "hess_max_ev": lambda: bench.Runner(problem, lambda m: Cockpit(m, [quantities.HessMaxEV()], diagnose=False),
                                            backpack=False),
    }
    times = {name: [] for name in [*runners, "plain (run)", "default + sparse"]}
    for _ in range(repeats):
        for name, make in runners.items():
            times[name].append(make().time_steps(5 if name == "hess_max_ev" else 20))
        for name, make in (("plain (run)", lambda: bench.Runner(problem)),
                           ("default + sparse", lambda: bench.Runner(
                               problem, lambda m: Cockpit(m, [quantities.HessMaxEV(track_schedule=SCHEDULE)]),
                               backpack=False))):
            runner = make()  # steps 0 .. steps - 1 from the start: the schedule's dense early points included
            times[name].append(run_from_start(runner, steps))
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {"default": medians["default"] / medians["plain"],
            "hess_max_ev": medians["hess_max_ev"] / medians["plain"],
            "default + sparse": medians["default + sparse"] / medians["plain (run)"]}


def run_from_start(runner, steps):
    """Seconds per step of ``steps`` steps from step 0 (no warm-up step: step 0 is one the schedule tracks)."""
    import time

    start = time.perf_counter()
    for _ in range(steps):
        runner.run_step()
    return (time.perf_counter() - start) / steps


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sharpness", description=__doc__.split("\n")[0])
    parser.add_argument("--problems", nargs="+", default=["mlp", "cnn"], choices=list(bench.PROBLEMS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--numbers", action="store_true", help="write the table into docs/numbers.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for problem in args.problems:
        ratios = measure(problem, args.repeats, args.steps)
        extrapolated = {n: ratios["default"] + points(n) * (ratios["hess_max_ev"] - 1) / n for n in HORIZONS}
        results[problem] = {**ratios, "extrapolated": extrapolated}
        print(f"{problem}: default {ratios['default']:.3g}x, a HessMaxEV step {ratios['hess_max_ev']:.3g}x; "
              f"{args.steps} steps of the default with HessMaxEV on the log schedule ({points(args.steps)} of them): "
              f"{ratios['default + sparse']:.3g}x; extrapolated: "
              + ", ".join(f"{n} steps ({points(n)}) {r:.3g}x" for n, r in extrapolated.items()), flush=True)
    if args.numbers:
        from experiments.seed_stability import write_numbers

        names = {"mlp": "MLP 784-64-10", "cnn": "CNN (benchmark)", "transformer": "transformer", "resnet_bn": "ResNet-BN"}
        rows = [[names.get(p, p), f"{r['default']:.3g}×", f"{r['hess_max_ev']:.3g}×", f"{r['default + sparse']:.3g}×",
                 *(f"{r['extrapolated'][n]:.3g}×" for n in HORIZONS)] for p, r in results.items()]
        write_numbers("sharpness_cost", f"python -m benchmarks.bench_sharpness --repeats {args.repeats} --steps "
                      f"{args.steps} (1 thread, interleaved, medians; the machine shared)",
                      {"header": ["problem", "default diagnosis", "one HessMaxEV step",
                                  f"default + HessMaxEV on the log schedule, first {args.steps} steps (measured)",
                                  *(f"extrapolated to {n:,} steps ({points(n)} λ_max steps)" for n in HORIZONS)],
                       "rows": rows})
    return results


if __name__ == "__main__":
    main()
