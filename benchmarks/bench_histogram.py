"""Benchmark ``cockpit_lite.histogram`` against torch, numpy and Cockpit's kernel.

    python benchmarks/bench_histogram.py [--quick] [--json PATH]

2-d: ``histogram2d`` with 40 x 50 bins over ((-1, 1), (-2, 2)) against
``torch.histogramdd``, ``numpy.histogram2d`` and Cockpit's ``put_``-based
``cockpit.quantities.utils_hists.histogram2d`` (if ``cockpit`` is importable).
1-d: ``histogram1d`` with 40 bins over (-1, 1) against ``torch.histc`` and
``numpy.histogram``. Data: ``skewed`` (x ~ N(0, 1e-3), most mass in the two
central x-bins; y ~ N(0, 0.1)) and ``uniform`` over the range; N = 1e6 and 1e7
float32 values (pairs); 1 and 2 torch threads on the CPU, plus CUDA rows when a
GPU is present.

Every contender gets the input in the layout it needs, prepared outside the
timing and already clipped into the range where it would otherwise drop
out-of-range values (the stacked [N, 2] sample of ``torch.histogramdd``, the
stacked [2, N] sample clamped to the outer bin centres of Cockpit's kernel, as
Cockpit does), which favours the baselines: ``cockpit_lite`` clips inside. The
y values repeat with period N / 100, as a parameter shared by the 100 rows of a
batch of individual gradients does, so that the row ``ours (y shared)``
(``histogram2d(x.view(100, -1), y[:N // 100])``, the typical call) bins the
same pairs as the others.

Times are medians over ``--rounds`` interleaved rounds (each contender once per
round) after one warm-up call each; "vs ours" is the contender's median over
the median of ``ours``. "same counts" compares with ``numpy`` on the same
float32 data: ``yes``, or the number of values (pairs) binned differently. The
float32 index arithmetic of ``cockpit_lite`` may move a value lying within a
few ulps of a non-dyadic edge (see ``cockpit_lite.histogram``). The load average
is printed because other processes on the CPUs distort the timings, the 2-thread
ones most (every parallel region waits for a descheduled thread).
"""

import argparse
import json
import os
import statistics
import time
import warnings

import numpy as np
import torch

from cockpit_lite.histogram import edges, histogram1d, histogram2d

BINS = (40, 50)
RANGE = ((-1.0, 1.0), (-2.0, 2.0))
ROWS_PER_BATCH = 100


def cockpit_kernel():
    """Cockpit's ``put_``-based 2-d histogram, or None if ``cockpit`` is not importable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from cockpit.quantities.utils_hists import histogram2d as kernel
    except ImportError:
        return None
    return kernel


def make_data(n, kind, seed=0):
    """float32 pairs (x, y) of length n; y has period n / ROWS_PER_BATCH."""
    generator = torch.Generator().manual_seed(seed)
    period = n // ROWS_PER_BATCH
    if kind == "skewed":
        x = 1e-3 * torch.randn(n, generator=generator)
        y = 0.1 * torch.randn(period, generator=generator)
    else:
        (xlo, xhi), (ylo, yhi) = RANGE
        x = xlo + (xhi - xlo) * torch.rand(n, generator=generator)
        y = ylo + (yhi - ylo) * torch.rand(period, generator=generator)
    return x, y.repeat(ROWS_PER_BATCH)


def moved(counts, reference):
    """'yes' if the counts equal the reference, else how many values changed bin."""
    counts = np.asarray(counts, dtype=np.int64)
    difference = int(np.abs(counts - reference).sum()) // 2
    return "yes" if difference == 0 and counts.sum() == reference.sum() else f"no ({difference})"


def contenders_2d(x, y, device, kernel):
    """{name: (call, to_numpy_counts)} for 2-d, inputs prepared in each one's layout."""
    (xlo, xhi), (ylo, yhi) = RANGE
    clipped = (x.clamp(xlo, xhi), y.clamp(ylo, yhi))
    xd, yd = x.to(device), y.to(device)
    period = x.numel() // ROWS_PER_BATCH
    rows, shared = xd.view(ROWS_PER_BATCH, period), yd[:period]
    calls = {
        "ours": (lambda: histogram2d(xd, yd, BINS, RANGE), lambda r: r[0].cpu().numpy()),
        "ours (y shared)": (lambda: histogram2d(rows, shared, BINS, RANGE),
                            lambda r: r[0].cpu().numpy()),
    }
    if device == "cpu":
        stacked = torch.stack(clipped, dim=1)
        calls["torch.histogramdd"] = (
            lambda: torch.histogramdd(stacked, bins=list(BINS), range=[xlo, xhi, ylo, yhi]),
            lambda r: r[0].numpy(),
        )
        xn, yn = clipped[0].numpy(), clipped[1].numpy()
        calls["numpy.histogram2d"] = (
            lambda: np.histogram2d(xn, yn, bins=list(BINS), range=[list(r) for r in RANGE]),
            lambda r: r[0],
        )
    if kernel is not None:
        centre = [((hi - lo) / b / 2) for b, (lo, hi) in zip(BINS, RANGE)]
        sample = torch.stack([
            x.clamp(xlo + centre[0], xhi - centre[0]), y.clamp(ylo + centre[1], yhi - centre[1])
        ]).to(device)
        calls["cockpit put_"] = (lambda: kernel(sample, BINS, RANGE), lambda r: r[0].cpu().numpy())
    return calls


def contenders_1d(x, device):
    """{name: (call, to_numpy_counts)} for 1-d."""
    lo, hi = RANGE[0]
    xd = x.to(device)
    clipped = x.clamp(lo, hi)
    cd = clipped.to(device)
    calls = {
        "ours": (lambda: histogram1d(xd, BINS[0], RANGE[0]), lambda r: r[0].cpu().numpy()),
        "torch.histc": (lambda: torch.histc(cd, bins=BINS[0], min=lo, max=hi),
                        lambda r: r.cpu().numpy()),
    }
    if device == "cpu":
        xn = clipped.numpy()
        calls["numpy.histogram"] = (lambda: np.histogram(xn, bins=BINS[0], range=(lo, hi)),
                                    lambda r: r[0])
    return calls


def time_interleaved(calls, rounds, device):
    """Median seconds of every call and its last result, over interleaved rounds."""
    def run(call):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = call()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, result

    results = {name: run(call)[1] for name, (call, _) in calls.items()}  # warm-up
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (call, _) in calls.items():
            seconds, results[name] = run(call)
            times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}, results


def bench(sizes, rounds, kernel):
    rows = []
    devices = [("cpu", 1), ("cpu", 2)] + ([("cuda", None)] if torch.cuda.is_available() else [])
    for n in sizes:
        for kind in ("skewed", "uniform"):
            x, y = make_data(n, kind)
            xn, yn = x.double().numpy(), y.double().numpy()
            (xlo, xhi), (ylo, yhi) = RANGE
            reference2d = np.histogram2d(
                np.clip(xn, xlo, xhi), np.clip(yn, ylo, yhi),
                bins=[edges(BINS[0], RANGE[0]), edges(BINS[1], RANGE[1])])[0].astype(np.int64)
            reference1d = np.histogram(np.clip(xn, xlo, xhi), edges(BINS[0], RANGE[0]))[0]
            for device, threads in devices:
                if threads is not None:
                    torch.set_num_threads(threads)
                for dim, calls, reference in (
                    (2, contenders_2d(x, y, device, kernel), reference2d),
                    (1, contenders_1d(x, device), reference1d),
                ):
                    medians, results = time_interleaved(calls, rounds, device)
                    for name, (_, counts) in calls.items():
                        rows.append({
                            "dim": dim, "device": device, "n": n, "data": kind,
                            "threads": threads, "contender": name,
                            "median_ms": 1e3 * medians[name],
                            "vs_ours": medians[name] / medians["ours"],
                            "same_counts": moved(counts(results[name]), reference),
                        })
                        print(format_row(rows[-1]), flush=True)
    return rows


HEADER = (f"{'dim':>3} {'device':>6} {'N':>6} {'data':>8} {'thr':>3}  {'contender':<18}"
          f"{'median ms':>10} {'vs ours':>8}  same counts")


def format_row(row):
    threads = "-" if row["threads"] is None else row["threads"]
    return (f"{row['dim']:>3} {row['device']:>6} {row['n']:>6.0e} {row['data']:>8} {threads:>3}  "
            f"{row['contender']:<18}{row['median_ms']:>10.2f} {row['vs_ours']:>8.2f}  "
            f"{row['same_counts']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke test")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (>= 5)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()
    sizes = (10**5,) if args.quick else (10**6, 10**7)
    rounds = args.rounds or (5 if args.quick else 7)
    kernel = cockpit_kernel()
    print(f"torch {torch.__version__}, numpy {np.__version__}, "
          f"CUDA: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}; "
          f"{rounds} rounds")
    if kernel is None:
        print("cockpit is not importable: Cockpit's put_ kernel skipped")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(HEADER)
    rows = bench(sizes, rounds, kernel)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
