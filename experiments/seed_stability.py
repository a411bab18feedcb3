"""Do the diagnosis rules hold on every seed? Every scenario of both suites on several seeds.

    python -m experiments.seed_stability record [--seeds 5] [--suite toy realistic] [--only NAME ...]
    python -m experiments.seed_stability judge [--json PATH]

``record`` trains every scenario of the toy suite (``experiments.broken_networks``) and
every recipe of the realistic suite (``experiments.realistic_diagnosis``) on each seed
under the default ``Cockpit`` and keeps each run's JSON-lines log in ``--out``
(``runs/seed_stability/SUITE/NAME/SEED.jsonl``; one CPU thread, one process).

``judge`` diagnoses the kept logs offline (the rules are pure functions of the record:
offline equals live, ``tests/diagnosis/test_scenarios.py``), so a change of a rule or a
threshold is judged on every seed without training again. A faulty scenario counts as
*found* only when its expected kind (and layer) is found in time on every seed (the
suites' own ``outcome``: the toy suite within 20 % of the steps, the realistic one within
30 steps of the mistake's onset); a healthy one as *clean* only when no seed raises a
finding of severity ``warning`` or ``error``. ``margins`` (below) moves each threshold of
``cockpit_lite.diagnosis.thresholds`` until a verdict flips: how far it is from the
healthy runs and from the faulty ones.
"""

import argparse
import dataclasses
import json
import logging
import math
import os
import time

from experiments import broken_networks as bn
from experiments import realistic_diagnosis as rd
from experiments.common import single_thread

RULES_DEFAULT = object()
"""``Offline``'s default: the registered rules."""

SUITES = {"toy": bn, "realistic": rd}
"""suite name -> module with ``SCENARIOS``/``RECIPES``, ``train`` and ``outcome``."""


def scenarios(suite):
    module = SUITES[suite]
    return module.SCENARIOS if suite == "toy" else module.RECIPES


def path(out, suite, name, seed):
    return os.path.join(out, suite, name, f"{seed}.jsonl")


def record(out, seeds, suites, only=None):
    """Train every (scenario, seed) of ``suites`` with a log in ``out``; an existing log is replaced."""
    for suite in suites:
        for name in only or scenarios(suite):
            if name not in scenarios(suite):
                continue
            for seed in range(seeds):
                log = path(out, suite, name, seed)
                os.makedirs(os.path.dirname(log), exist_ok=True)
                if os.path.exists(log):
                    os.remove(log)
                start = time.perf_counter()
                SUITES[suite].train(name, seed=seed, log=log)
                print(f"{suite} {name} seed {seed}: {time.perf_counter() - start:.1f} s", flush=True)


class Offline:
    """A kept run (a log path, or its ``(header, record)``) as the suites' ``outcome`` reads a Cockpit:
    ``findings`` and ``get_output()``, found by ``rules`` (default: all).

    ``findings`` are the run's findings, causes first (as ``diagnose`` gives them);
    ``seen`` maps each to the step at which the rules raised it (a finding names the step
    where its evidence begins, which can be earlier); ``emitted()`` is this run with every
    finding's step replaced by that step, what "found by step N" is judged on.
    """

    def __init__(self, log, rules=RULES_DEFAULT):
        from cockpit_lite import log as _log
        from cockpit_lite.diagnosis.diagnose import Diagnosis
        from cockpit_lite.diagnosis.precedence import ordered

        self.header, self.record = _log.read_jsonl(log) if isinstance(log, (str, os.PathLike)) else log
        params = self.header.get("params") or []
        diagnosis = Diagnosis([p["name"] for p in params] or None, [p.get("shape") or [] for p in params] or None,
                              *(() if rules is RULES_DEFAULT else (rules,)))
        self.seen = {}
        for step in sorted(self.record):
            for finding in diagnosis.feed(step, self.record[step])[0]:
                self.seen[id(finding)] = step
        self.findings = [f for f, _ in ordered(diagnosis.findings)]

    def get_output(self):
        return self.record

    def emitted(self):
        view = Offline.__new__(Offline)
        view.header, view.record = self.header, self.record
        view.findings = [dataclasses.replace(f, step=self.seen[id(f)]) for f in self.findings]
        return view


def verdict(suite, name, run):
    """``(ok, first step at which the expected finding was raised, or None)`` of one kept run, by the suite's own
    ``outcome`` applied to the steps at which the findings were raised."""
    run = run.emitted()
    if suite == "toy":
        spec = bn.SCENARIOS[name]
        if spec.expect is None:  # the criterion: no warning or error (info notes are allowed)
            return not [f for f in run.findings if f.severity != "info"], None
        passed, first, _ = bn.outcome(name, run)
        return passed, first
    return rd.outcome(name, run)


def judge(out, suites=tuple(SUITES), only=None):
    """``[{suite, scenario, expect, seeds: [{seed, ok, first, findings}]}]`` of every kept scenario."""
    rows = []
    for suite in suites:
        for name, spec in scenarios(suite).items():
            if only and name not in only:
                continue
            folder = os.path.join(out, suite, name)
            if not os.path.isdir(folder):
                continue
            runs = []
            for file in sorted(os.listdir(folder), key=lambda f: int(f.split(".")[0])):
                run = Offline(os.path.join(folder, file))
                ok, first = verdict(suite, name, run)
                runs.append({"seed": int(file.split(".")[0]), "ok": bool(ok), "first": first,
                             "findings": [f"{f.kind}@{f.step}" + (f"[{f.layer}]" if f.layer is not None else "")
                                          + {"info": "(i)", "warning": "", "error": ""}[f.severity]
                                          for f in run.findings]})
            expect = None if spec.expect is None else f"{spec.expect[0]} [{spec.expect[1]}]"
            rows.append({"suite": suite, "scenario": name, "expect": expect, "seeds": runs})
    return rows


def show(rows):
    for row in rows:
        ok = sum(r["ok"] for r in row["seeds"])
        mark = "ok" if ok == len(row["seeds"]) else ("MISSED" if row["expect"] else "FALSE ALARM")
        print(f"{row['suite']} {row['scenario']} ({row['expect'] or 'healthy'}): {ok}/{len(row['seeds'])} {mark}")
        for r in row["seeds"]:
            if not r["ok"] or row["expect"] is None and r["findings"]:
                print(f"    seed {r['seed']}: {', '.join(r['findings']) or '-'}")
    for suite in sorted({r["suite"] for r in rows}):
        faulty = [r for r in rows if r["suite"] == suite and r["expect"]]
        healthy = [r for r in rows if r["suite"] == suite and not r["expect"]]
        print(f"{suite}: faulty found on every seed {sum(all(s['ok'] for s in r['seeds']) for r in faulty)}/"
              f"{len(faulty)}; healthy clean on every seed {sum(all(s['ok'] for s in r['seeds']) for r in healthy)}/"
              f"{len(healthy)}")


# ----------------------------------------------------------------------------- margins

MARGINS = [
    ("SPIKE", "lr_too_high", 1), ("SPIKE_ONE", "lr_too_high", 1), ("DIVERGE_RATIO", "lr_too_high", 1),
    ("LEARNED", "lr_too_high", 1), ("COLLAPSE", "lr_too_high", 1), ("HIGH_RATIO", "lr_too_high", 1),
    ("OVERSHOOT_RATIO", "lr_too_high", 1), ("OVERSHOOT_LOSS", "lr_too_high", 1),
    ("LOW_DROP", "lr_too_low", -1), ("LOW_RATIO", "lr_too_low", -1), ("LATE_STEP", "lr_too_low", 1),
    ("LATE_COLLAPSE", "lr_too_low", 1), ("CLOSE_STEPS", "lr_too_low", -1), ("STALL_SHARE", "lr_too_low", 1),
    ("EXPLODE_RATIO", "exploding_gradients", 1), ("EXPLODE_GROWTH", "exploding_gradients", 1),
    ("ACT_GAIN", "exploding_gradients", 1), ("VANISH_RATIO", "vanishing_gradients", -1),
    ("DEAD", "dead_relu", 1), ("SATURATED", "saturated_activations", 1), ("INPUT_SCALE", "unnormalized_inputs", 1),
    ("CHANCE_FACTOR", "shuffled_labels", -1), ("CHANCE_LOSS", "shuffled_labels", 1),
    ("NOISE_RATIO", "noise_dominates", 1), ("EOS", "edge_of_stability", 1),
    ("OVERFIT_RISE", "overfitting", 1), ("OVERFIT_Z", "overfitting", 1), ("OVERFIT_FALL", "overfitting", 1),
    ("OVERFIT_GAP", "overfitting", 1),
]
"""``(threshold of cockpit_lite.diagnosis.thresholds, the kind it decides, +1 where a larger value raises
fewer findings, -1 where it raises more)``; the counts (``SUSTAIN``, windows) are left as they are."""

LIMIT = 1000.0
"""The farthest factor a threshold is moved in the search."""


def load(out, suites=tuple(SUITES)):
    """``[(suite, name, expected kind or None, (header, record))]`` of every kept run."""
    from cockpit_lite import log as _log

    runs = []
    for suite in suites:
        for name, spec in scenarios(suite).items():
            folder = os.path.join(out, suite, name)
            for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                runs.append((suite, name, spec.expect and spec.expect[0], _log.read_jsonl(os.path.join(folder, file))))
    return runs


def _flips(runs, kind, healthy):
    """Whether a healthy run raises ``kind`` (warning or error), or a faulty run of ``kind`` misses it, with
    the thresholds as they are now set."""
    from cockpit_lite.diagnosis.rules import RULES

    rules = [rule for rule in RULES if rule.KIND == kind]
    for suite, name, expect, kept in runs:
        if healthy and expect is None:
            if any(f.kind == kind and f.severity != "info" for f in Offline(kept, rules).findings):
                return True
        elif not healthy and expect == kind and not verdict(suite, name, Offline(kept, rules))[0]:
            return True
    return False


COPIED = {"DEAD": "dead_relu", "SATURATED": "saturated_activations"}
"""Thresholds an activation rule copies into its class attribute ``THRESHOLD`` (kind of the rule)."""


def _set(constant, value):
    from cockpit_lite.diagnosis import thresholds
    from cockpit_lite.diagnosis.rules import RULES

    for rule in RULES:
        if COPIED.get(constant) == rule.KIND:
            rule.THRESHOLD = value
    setattr(thresholds, constant, value)


def flip_factor(runs, constant, kind, sign, healthy, steps=12):
    """The least factor f in [1, ``LIMIT``] by which ``constant`` can be moved towards more findings (healthy)
    or fewer (faulty) before a verdict flips: ``1.0`` when it already flips as it is, ``inf`` when it does
    not flip within ``LIMIT`` (bisection on log f)."""
    from cockpit_lite.diagnosis import thresholds

    base = getattr(thresholds, constant)
    towards = -sign if healthy else sign  # the exponent's sign that moves the value that way

    def flips(factor):
        _set(constant, base * factor ** towards)
        try:
            return _flips(runs, kind, healthy)
        finally:
            _set(constant, base)

    if flips(1.0):
        return 1.0
    if not flips(LIMIT):
        return math.inf
    low, high = 0.0, math.log(LIMIT)
    for _ in range(steps):
        mid = (low + high) / 2
        low, high = (low, mid) if flips(math.exp(mid)) else (mid, high)
    return math.exp(high)


def margins(runs):
    """``[{constant, kind, value, healthy, faulty}]``: the factors ``flip_factor`` finds on either side."""
    from cockpit_lite.diagnosis import thresholds

    rows = []
    for constant, kind, sign in MARGINS:
        row = {"constant": constant, "kind": kind, "value": getattr(thresholds, constant), "sign": sign,
               "healthy": flip_factor(runs, constant, kind, sign, True),
               "faulty": flip_factor(runs, constant, kind, sign, False)}
        rows.append(row)
        print(f"{constant} ({kind}) = {row['value']:g}: healthy runs flip at {_factor(row['healthy'])}, faulty at "
              f"{_factor(row['faulty'])}", flush=True)
    return rows


def _factor(value):
    return "never (> 1000x)" if math.isinf(value) else f"{value:.3g}x"


def seeds_table(rows):
    """``{header, rows}``: one row per scenario, a cell per seed (the step the expected kind was raised at, or
    "clean" / "warns"), and the verdict."""
    seeds = max(len(row["seeds"]) for row in rows)
    out = []
    for row in rows:
        cells = []
        for run in row["seeds"]:
            if row["expect"] is None:
                cells.append("clean" if run["ok"] else "**warns**")
            else:
                cells.append(str(run["first"]) if run["ok"] else f"**{'late' if run['first'] is not None else 'missed'}**")
        ok = all(run["ok"] for run in row["seeds"])
        out.append([row["suite"], f"`{row['scenario']}`", row["expect"] or "healthy", *cells,
                    "found on every seed" if ok and row["expect"] else "clean on every seed" if ok else "**not**"])
    return {"header": ["suite", "scenario", "expected", *[f"seed {i}" for i in range(seeds)], "result"], "rows": out}


def margins_table(rows):
    """``{header, rows}`` of ``margins``: each threshold, the value at which the first healthy seed warns and the
    value at which the first faulty seed is missed, and the factors."""
    def at(row, side):
        factor = row[side]
        if math.isinf(factor):
            return "never (> 1000×)"
        towards = -row["sign"] if side == "healthy" else row["sign"]
        value = row["value"] * factor ** towards
        return f"{value:.3g} ({factor:.3g}×)" if factor > 1 else f"{value:.3g} (**as is**)"
    return {"header": ["threshold", "kind", "value", "first healthy warning at", "first faulty miss at"],
            "rows": [[f"`{r['constant']}`", r["kind"], f"{r['value']:g}", at(r, "healthy"), at(r, "faulty")]
                     for r in rows]}


def write_numbers(name, command, table, path=os.path.join(os.path.dirname(__file__), "..", "docs", "numbers.json")):
    """Write ``table`` as ``measured[name]`` of docs/numbers.json (rendered by ``tools.make_docs``)."""
    with open(path, encoding="utf-8") as file:
        numbers = json.load(file)
    numbers["measured"][name] = {"command": command, **table}
    with open(path, "w", encoding="utf-8") as file:
        json.dump(numbers, file, indent=1, ensure_ascii=False)
        file.write("\n")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.seed_stability", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("record", "judge", "margins"))
    parser.add_argument("--out", default=os.path.join("runs", "seed_stability"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--suite", nargs="+", choices=list(SUITES), default=list(SUITES))
    parser.add_argument("--only", nargs="+")
    parser.add_argument("--json", help="judge: also write the rows to this file")
    parser.add_argument("--numbers", action="store_true", help="judge, margins: write the table into docs/numbers.json")
    args = parser.parse_args(argv)
    single_thread()
    logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)
    if args.command == "record":
        return record(args.out, args.seeds, args.suite, args.only)
    if args.command == "margins":
        rows = margins(load(args.out, args.suite))
        if args.numbers:
            write_numbers("diagnosis_margins", "python -m experiments.seed_stability margins (after record)",
                          margins_table(rows))
        return rows
    rows = judge(args.out, args.suite, args.only)
    show(rows)
    if args.numbers:
        write_numbers("diagnosis_seeds", f"python -m experiments.seed_stability record --seeds {args.seeds}; "
                      "python -m experiments.seed_stability judge", seeds_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(rows, file, indent=1)
    return rows


if __name__ == "__main__":
    main()
