"""The probe of sample independence (``cockpit_lite/engine/independence.py``): its cost, and how far
healthy models' rows depart from independence.

Usage::

    python -m experiments.independence_probe cost [--models lstm gpt ...] [--reps 5]
    OMP_NUM_THREADS=1 DEPARTURES=DIR python -m pytest -q -n auto -p experiments.independence_probe
    python -m experiments.independence_probe departures DIR

``cost``: the probe's time at a Cockpit's first tracked step (``configuration("economy")``, float32,
batch 64, 1 thread) over the fastest of three plain steps (forward and backward) of the same model
and batch, median over ``--reps`` fresh models. Loaded as a pytest plugin (``-p``), the module
records every probed output's ``independence.departure`` (``‖u(w)_n − w_n u(1)_n‖`` over the
row's scale, its largest row, along the axis the rule reads as the samples) with its tolerance and verdict
and the test that made it, one JSON file per worker in ``$DEPARTURES``; ``departures`` prints, per
tolerance, the largest departure among the outputs found independent and the tests whose outputs
were found mixed.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import time
import warnings

import torch

from cockpit_lite.engine import independence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("lstm", "resnet_gn", "transformer", "gpt")


# -- as a pytest plugin ----------------------------------------------------------------------

_RECORDS, _TEST = [], {"id": None, "probing": False}


def pytest_configure(config):
    """Record the decisions of the engine's probes (not those of tests that call ``_mixes`` on
    hand-made products)."""
    mixes, probe = independence._mixes, independence.Probe.mixed

    def recorded(ones, weighted, weights, rtol, axis):
        verdict = mixes(ones, weighted, weights, rtol, axis)
        if _TEST["probing"]:
            _RECORDS.append([_TEST["id"], independence.departure(ones, weighted, weights, axis), rtol, verdict])
        return verdict

    def probing(self, *args, **kwargs):
        _TEST["probing"] = True
        try:
            return probe(self, *args, **kwargs)
        finally:
            _TEST["probing"] = False

    independence._mixes, independence.Probe.mixed = recorded, probing


def pytest_runtest_setup(item):
    _TEST["id"] = item.nodeid


def pytest_sessionfinish(session):
    folder = os.environ.get("DEPARTURES")
    if folder:
        os.makedirs(folder, exist_ok=True)
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as file:
            json.dump(_RECORDS, file)


def summarize(records):
    """``({rtol: (outputs, largest departure of an independent one, its test)}, [tests found mixed])``."""
    healthy, mixed = {}, []
    for test, value, rtol, verdict in records:
        if verdict:
            mixed.append(test)
        else:
            count, largest, where = healthy.get(rtol, (0, -1.0, None))
            healthy[rtol] = (count + 1, *((value, test) if value > largest else (largest, where)))
    return healthy, sorted(set(mixed))


# -- the cost ---------------------------------------------------------------------------------

def cost(name, rep):
    """The probe's time over the fastest plain step, for ``tests/models.py``'s model ``name``."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import models

    from cockpit_lite import Cockpit, configuration

    build, loss_class, inputs, target = models.REALISTIC[name]
    torch.manual_seed(rep)
    model, lossfunc = build().float(), loss_class()
    g = torch.Generator().manual_seed(rep)
    x, y = inputs(g, 64), target(g, 64)
    x, y = (t.float() if t.is_floating_point() else t for t in (x, y))
    plain = []
    for _ in range(3):
        began = time.perf_counter()
        model.zero_grad()
        lossfunc(model(x), y).backward()
        plain.append(time.perf_counter() - began)
    spent = []
    probe = independence.Probe.mixed

    def timed(self, *args, **kwargs):
        began = time.perf_counter()
        try:
            return probe(self, *args, **kwargs)
        finally:
            spent.append(time.perf_counter() - began)

    independence.Probe.mixed = timed
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        cp = Cockpit(model, quantities=configuration("economy"), diagnose=False)
        model.zero_grad()
        loss = lossfunc(model(x), y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with cp(0, info={"loss": loss, "optimizer": opt}):
                loss.backward()
    finally:
        independence.Probe.mixed = probe
    return sum(spent) / min(plain)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    costs = sub.add_parser("cost")
    costs.add_argument("--models", nargs="+", default=list(MODELS))
    costs.add_argument("--reps", type=int, default=5)
    read = sub.add_parser("departures")
    read.add_argument("folder")
    args = parser.parse_args()
    if args.command == "cost":
        torch.set_num_threads(1)
        for name in args.models:
            ratios = [cost(name, rep) for rep in range(args.reps)]
            print(f"{name:12s} probe / plain step: median {statistics.median(ratios):.2f} "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f})", flush=True)
        return
    records = []
    for path in glob.glob(os.path.join(args.folder, "*.json")):
        with open(path, encoding="utf-8") as file:
            records += json.load(file)
    healthy, mixed = summarize(records)
    print(f"{len(records)} probed outputs")
    for rtol, (count, largest, test) in sorted(healthy.items()):
        print(f"tolerance {rtol:g}: {count} independent, largest departure {largest:.2g} ({test})")
    print("found mixed:", ", ".join(mixed) or "none")


if __name__ == "__main__":
    main()
