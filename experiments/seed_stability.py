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
    """A kept run as the suites' ``outcome`` reads a Cockpit: ``findings`` and ``get_output()``.

    ``findings`` are the run's findings, causes first (as ``diagnose`` gives them);
    ``seen`` maps each to the step at which the rules raised it (a finding names the step
    where its evidence begins, which can be earlier); ``emitted()`` is this run with every
    finding's step replaced by that step, what "found by step N" is judged on.
    """

    def __init__(self, log, rules=RULES_DEFAULT):
        from cockpit_lite import log as _log
        from cockpit_lite.diagnosis.diagnose import Diagnosis
        from cockpit_lite.diagnosis.precedence import ordered

        self.header, self.record = _log.read_jsonl(log)
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.seed_stability", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("record", "judge"))
    parser.add_argument("--out", default=os.path.join("runs", "seed_stability"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--suite", nargs="+", choices=list(SUITES), default=list(SUITES))
    parser.add_argument("--only", nargs="+")
    parser.add_argument("--json", help="judge: also write the rows to this file")
    args = parser.parse_args(argv)
    single_thread()
    logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)
    if args.command == "record":
        return record(args.out, args.seeds, args.suite, args.only)
    rows = judge(args.out, args.suite, args.only)
    show(rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(rows, file, indent=1)
    return rows


if __name__ == "__main__":
    main()
