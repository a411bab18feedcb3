"""Pre-flight checks on the digits demo model, and on a deliberately broken variant.

    python -m experiments.preflight [--out runs/preflight] [--seed 0]

Runs ``cockpit_lite.checks.run`` on the demo's CNN with the demo's data
(``cockpit_lite.demo``: digits scaled to [0, 1]) and on the same set-up with three
one-line bugs planted (a softmax after the last layer, in front of
``CrossEntropyLoss``; pixels on 0..255; 20 training images copied into the test
split), and prints both reports. Then, for the healthy model, an LR range test
(``OUT/lr_range.csv`` and the figure ``OUT/lr_range.png``) and a suggested
gradient-clipping value. Takes a few seconds on one thread (``--tiny``: a 30-step
sweep).
"""

import json
import math
import os

import torch
from torch import nn

from cockpit_lite import checks
from cockpit_lite.checks import overfit_one_batch
from experiments import common
from cockpit_lite.demo import build_model

BATCH = 64


def setup(seed=0, broken=False):
    """``(model, loss, batch, options)`` of the demo, or of its broken variant."""
    torch.manual_seed(seed)
    train, test = common.load_digits_tensors(seed, scaling="raw255" if broken else "unit")
    model = build_model("cnn")
    if broken:
        model.append(nn.Softmax(dim=1))  # bug 1: probabilities fed to CrossEntropyLoss
        test = (torch.cat([train[0][:20], test[0][20:]]), test[1])  # bug 3: test images from train
    data = {"x_train": train[0], "y_train": train[1], "x_test": test[0], "y_test": test[1]}
    options = {"task": "classification", "num_classes": 10, "data": data}
    return model, nn.CrossEntropyLoss(), (train[0][:BATCH], train[1][:BATCH]), options


def lr_range(model, loss_fn, data, out, seed, steps=100):
    """LR range test on the training split (batches of 64), CSV and figure in ``out``."""
    from instruments.gauges import lr_range as lr_gauge

    images, labels = data["x_train"], data["y_train"]
    generator = torch.Generator().manual_seed(seed)
    batches = [(images[i], labels[i]) for i in common.minibatches(len(labels), BATCH, generator)]
    result = checks.lr_range_test(model, loss_fn, batches, start=1e-4, end=10.0, steps=steps, seed=seed)
    os.makedirs(out, exist_ok=True)
    csv_path = result.to_csv(os.path.join(out, "lr_range.csv"))
    fig = common.new_figure(5.5, 3.6)
    lr_gauge.gauge(csv_path, fig.add_subplot())
    png_path = common.save_figure(fig, os.path.join(out, "lr_range.png"))
    clip = checks.suggest_clip_value(model, loss_fn, batches, seed=seed)
    return result, clip, csv_path, png_path


def calibrate(seeds, names=None):
    """Every case of ``experiments.preflight_cases`` on ``seeds`` seeds (the healthy ones with and without
    ``data=``): ``[{case, seed, data, healthy, expected, results: {check: (status, value, threshold)}}]``
    (``overfit_one_batch``: its message instead of the threshold, which says the steps it took)."""
    from experiments import preflight_cases

    rows = []
    for name, build in preflight_cases.CASES.items():
        if names and name not in names:
            continue
        healthy = name in preflight_cases.HEALTHY
        for seed in range(seeds):
            for with_data in (True, False) if healthy else (True,):
                case = build(seed=seed)
                if not with_data and "data" not in case.options:
                    continue
                options = {k: v for k, v in case.options.items() if with_data or k != "data"}
                report = checks.run(case.model, case.loss_fn, case.batch, **options, seed=seed)
                rows.append({"case": name, "seed": seed, "data": with_data and "data" in case.options,
                             "healthy": healthy, "expected": sorted(case.expected),
                             "results": {r.name: (r.status, r.value, r.message if r.name == "overfit_one_batch"
                                                  else r.threshold) for r in report}})
                failed = [n for n, (status, *_) in rows[-1]["results"].items() if status == "failed"]
                print(f"{name} seed {seed}{'' if rows[-1]['data'] else ' (no data=)'}: failed {failed or '-'}"
                      + ("" if healthy or set(failed) == set(case.expected) else f"  EXPECTED {sorted(case.expected)}"),
                      flush=True)
    return rows


def _threshold(text):
    """``(operator, number)`` of a result's threshold such as ``"<= 1.5"`` (its first part: ``"<= 0.9 (held-out
    <= 0.7)"`` gives ``("<=", 0.9)``), or ``None``."""
    parts = text.split()
    try:
        return (parts[0], float(parts[1])) if len(parts) >= 2 and parts[0] in ("<=", ">=") else None
    except ValueError:
        return None


def _margin(operator, limit, healthy, faulty):
    """How far the healthy extreme and the faulty extreme sit from the threshold (factors), or ``"–"``."""
    if operator == "<=" and limit > 0:
        return (f"{limit / max(healthy):.3g}×" if max(healthy) > 0 else "∞",
                f"{min(faulty) / limit:.3g}×" if faulty else "–")
    if operator == ">=" and limit > 0:
        return (f"{min(healthy) / limit:.3g}×", f"{limit / max(faulty):.3g}×" if faulty and max(faulty) > 0 else "–")
    return "–", "–"


def spread(rows):
    """``{header, rows}``: per check, its threshold, the healthy runs' outcomes and values, the planted bugs' values,
    and the margins (healthy: threshold / worst healthy value; faulty: best faulty value / threshold, for a
    threshold of the form ``<= x``; the inverse for ``>= x``). ``overfit_one_batch`` stops at its threshold: its
    spread is the steps it took (of ``MAX_STEPS``)."""
    def span(values):
        return f"{min(values):.3g} – {max(values):.3g}" if values else "–"

    table = []
    for name in checks.CHECKS:
        results = [(r["healthy"], name in r["expected"], *r["results"][name]) for r in rows]
        healthy = [(status, value, text) for is_healthy, _, status, value, text in results if is_healthy]
        counts = {s: sum(1 for status, _, _ in healthy if status == s) for s in ("passed", "inconclusive", "skipped",
                                                                                  "failed")}
        faulty = [(status, value, text) for _, expected, status, value, text in results if expected]
        caught = sum(1 for status, _, _ in faulty if status == "failed")
        finite = lambda group: [v for s, v, _ in group if v is not None and math.isfinite(v) and s != "skipped"]
        threshold = next((t for *_, t in healthy + faulty if t), "")
        good, bad = finite([h for h in healthy if h[0] == "passed"]), finite(faulty)
        runs = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "–"
        if name == "overfit_one_batch":  # it stops once the loss reaches the threshold: the steps it took
            good = [int(t.split(" in ")[-1].split()[0]) for s, _, t in healthy if s == "passed" and " in " in t]
            limit = overfit_one_batch.RELATIVE
            threshold = f"<= {limit:g} within {overfit_one_batch.MAX_STEPS} steps"
            margins = (f"{overfit_one_batch.MAX_STEPS / max(good):.3g}× (steps)" if good else "–",
                       f"{min(bad) / limit:.3g}×" if bad else "–")
            good_text = f"{span(good)} steps"
        else:
            parsed = _threshold(threshold)
            beyond = [v for v in good if parsed and parsed[0] == "<=" and v > parsed[1]]
            if beyond:  # passed by a second test (imbalanced data in both splits)
                runs += f" ({len(beyond)} beyond it, passed by the split comparison)"
                good = [v for v in good if v <= parsed[1]]
            margins = _margin(*parsed, good, bad) if parsed and good else ("–", "–")
            good_text = span(good)
        table.append([f"`{name}`", threshold.replace("|", "\\|"), good_text, runs, span(bad) if faulty else "–",
                      f"{caught} of {len(faulty)}" if faulty else "–", *margins])
    return {"header": ["check", "threshold", "healthy: value when passed", "healthy runs", "planted bugs: value",
                       "planted bugs caught", "healthy margin", "faulty margin"], "rows": table}


def main(argv=None):
    parser = common.parser("preflight", __doc__)
    parser.add_argument("--calibrate", type=int, metavar="SEEDS",
                        help="instead: every healthy and faulty case of experiments.preflight_cases on SEEDS seeds, "
                             "and the spread of each check's value")
    parser.add_argument("--numbers", action="store_true", help="with --calibrate: write the spread to docs/numbers.json")
    parser.add_argument("--json", help="with --calibrate: also write the runs to this file")
    parser.add_argument("--rows", help="with --calibrate: read the runs a --json run wrote instead of running")
    args = parser.parse_args(argv)
    common.single_thread()
    if args.calibrate:
        if args.rows:
            with open(args.rows, encoding="utf-8") as file:
                rows = json.load(file)
        else:
            rows = calibrate(args.calibrate)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as file:
                json.dump(rows, file, indent=1)
        table = spread(rows)
        print("\n" + "\n".join(" | ".join(str(c) for c in row) for row in [table["header"], *table["rows"]]))
        failures = [(r["case"], r["seed"], r["data"], n) for r in rows if r["healthy"]
                    for n, (status, *_) in r["results"].items() if status == "failed"]
        missed = [(r["case"], r["seed"], sorted(set(r["expected"]) - {n for n, (s, *_) in r["results"].items()
                                                                       if s == "failed"}))
                  for r in rows if not r["healthy"] and set(r["expected"]) - {n for n, (s, *_) in r["results"].items()
                                                                               if s == "failed"}]
        print(f"\nhealthy runs: {sum(r['healthy'] for r in rows)}, failures on them: {failures or 'none'}")
        print(f"faulty runs: {sum(not r['healthy'] for r in rows)}, planted bugs missed: {missed or 'none'}")
        if args.numbers:
            from experiments.seed_stability import write_numbers

            write_numbers("preflight_spread", f"python -m experiments.preflight --calibrate {args.calibrate}", table)
        return rows
    reports = {}
    for name, broken in (("demo CNN", False), ("broken variant", True)):
        model, loss_fn, batch, options = setup(args.seed, broken)
        reports[name] = checks.run(model, loss_fn, batch, **options, seed=args.seed)
        print(f"== {name}" + (": softmax before CrossEntropyLoss, pixels on 0..255, 20 test images from train"
                              if broken else ": the cockpit_lite.demo model and data"))
        print(reports[name], end="\n\n")
    model, loss_fn, _, options = setup(args.seed)
    result, clip, csv_path, png_path = lr_range(model, loss_fn, options["data"], args.out, args.seed,
                                                   steps=30 if args.tiny else 100)
    print(f"== tools on the demo CNN\n{result}\n{clip}\ncurve: {csv_path}\nfigure: {png_path}")
    return reports, result


if __name__ == "__main__":
    main()
