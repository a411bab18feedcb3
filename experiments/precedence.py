"""Which finding is the cause: apply each finding's fix alone and see which one clears the run.

    python -m experiments.precedence [--seeds 5] [--suite toy realistic] [--only NAME ...] [--json PATH]

For every faulty set-up of both suites that reports more than one finding of severity
``warning`` or ``error`` (the broken networks of ``experiments.broken_networks``, the README's
first example, the faulty recipes of ``experiments.realistic_diagnosis``), on each seed, the
run is repeated once per reported kind with that kind's fix applied alone (``FIXES``: what its
suggestion says, made concrete). A fix that leaves no warning or error removed the cause: its
kind is a *root*, and the kinds it cleared with it are its consequences. The pairs are what
``cockpit_lite.diagnosis.precedence`` orders by; docs/diagnosis.md shows them.

The summary measures the ordering itself: for each multi-finding run, is the finding the
report lists first one whose fix clears the run?
"""

import argparse
import dataclasses
import json

import torch
from torch import nn

from experiments import broken_networks as bn
from experiments import realistic_diagnosis as rd
from experiments.common import kaiming


def _scaled_lr(make_optimizer, factor):
    def make(params):
        optimizer = make_optimizer(params)
        for group in optimizer.param_groups:
            group["lr"] *= factor
        return optimizer

    return make


def _standardised(data):
    (x, y), (xv, yv) = data
    if not torch.is_floating_point(x):
        raise NotApplicable("token inputs have no scale to standardise")
    mean, std = x.mean(0, keepdim=True), x.std(0, keepdim=True).clamp_min(1e-6)
    return ((x - mean) / std, y), ((xv - mean) / std, yv)


def _leaky(model):
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(module, child_name, nn.LeakyReLU(0.01))
    return model


def _xavier(model):
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)
    return model


class NotApplicable(Exception):
    """A fix that does not apply to a set-up (standardising token ids)."""


def _built(change):
    """A fix that changes what a set-up builds: ``change(model, data, optimizer factory, finding)``."""
    return lambda spec, f: dataclasses.replace(spec, build=lambda s, build=spec.build: change(*build(s), f))


def _set(**fields):
    return lambda spec, f: dataclasses.replace(spec, **fields)


def _exploding(spec, finding):
    """At initialisation: "initialise the weights for the activation (Kaiming ...)"; else "clip the gradient norm"."""
    if "gain" in finding.evidence:
        return _built(lambda m, d, o, f: (kaiming(m), d, o))(spec, finding)
    return dataclasses.replace(spec, clip=1.0)


FIXES = {
    # "lower the learning rate by ~Nx" (the finding's divisor, from its updates), else "(by 3-10x)": 10x
    "lr_too_high": _built(lambda m, d, o, f: (m, d, _scaled_lr(o, 1 / f.evidence.get("lr_divisor", 10.0)))),
    # "lower the learning rate below 2(1+momentum)/lambda_max": to 0.9 of that
    "edge_of_stability": _built(lambda m, d, o, f: (m, d, _scaled_lr(o, 0.9 * f.evidence["limit"]
                                                                      / f.evidence["product"]))),
    "lr_too_low": _built(lambda m, d, o, f: (m, d, _scaled_lr(o, 10.0))),  # "raise the learning rate (by about 10x)"
    "unnormalized_inputs": _built(lambda m, d, o, f: (m, _standardised(d), o)),  # "standardise the inputs"
    "dead_relu": _built(lambda m, d, o, f: (_leaky(m), d, o)),  # "... or use LeakyReLU/GELU"
    "saturated_activations": _built(lambda m, d, o, f: (_xavier(m), d, o)),  # "scale the initialisation down (Xavier)"
    "noise_dominates": lambda spec, f: dataclasses.replace(spec, batch=16 * spec.batch),  # "increase the batch size"
    "exploding_gradients": _exploding,
    "missing_zero_grad": _set(zero_grad=True),  # "call optimizer.zero_grad() once per optimizer step"
}
"""``kind -> (set-up, the run's first finding of that kind) -> the same set-up with that finding's suggested fix
applied``."""


def _readme_example(seed):
    """README's first example on a set-up of this suite: 0..255 inputs, SGD at 0.1 (one fixed batch there)."""
    return bn.mlp([16], n_in=8, n_out=3), _uniform_255(seed), bn.sgd(0.1)


def _uniform_255(seed):
    g = torch.Generator().manual_seed(seed + 11)
    x, y = 255 * torch.rand(320, 8, generator=g), torch.randint(0, 3, (320,), generator=g)
    return (x[:256], y[:256]), (x[256:], y[256:])


EXTRA = {"readme_255_sgd": bn.Scenario(_readme_example, ("unnormalized_inputs", None), batch=64, steps=20)}
"""Set-ups beside ``broken_networks.SCENARIOS``."""

SUITES = {"toy": {**bn.SCENARIOS, **EXTRA}, "realistic": rd.RECIPES}
"""suite -> name -> set-up."""


EVIDENCE = {
    ("dead_relu", "unnormalized_inputs"): ("toy", "unnormalized_offset_synthetic", 0),
    ("dead_relu", "lr_too_high"): ("toy", "lr_too_high_sgd", 0),
    ("dead_relu", "missing_zero_grad"): ("realistic", "accumulation_no_zero_grad", 0),
    ("dead_relu", "exploding_gradients:init"): ("toy", "exploding_randn_relu_sgd", 0),
    ("lr_too_high", "unnormalized_inputs"): ("toy", "readme_255_sgd", 0),
    ("lr_too_high", "missing_zero_grad"): ("realistic", "accumulation_no_zero_grad", 0),
    ("lr_too_high", "exploding_gradients:init"): ("toy", "exploding_randn_relu_sgd", 0),
    ("lr_too_low", "saturated_activations"): ("toy", "saturated_sigmoid_synthetic", 0),
    ("nan_loss", "exploding_gradients"): ("realistic", "irnn_wide_sgd_unclipped", 0),
    ("nan_loss", "exploding_gradients:init"): ("toy", "exploding_randn_relu_sgd", 0),
    ("edge_of_stability", "lr_too_high"): ("toy", "edge_of_stability_gd", 0),
    ("exploding_gradients", "lr_too_high"): ("toy", "lr_too_high_adam_cnn", 0),
    ("exploding_gradients", "missing_zero_grad"): ("realistic", "accumulation_no_zero_grad", 0),
}
"""``(consequence, cause) -> (suite, set-up, seed)``: a run on which the cause's fix cleared the consequence,
one per pair of ``cockpit_lite.diagnosis.precedence.CAUSES`` (the test re-runs each)."""


def findings(suite, name, seed, fix=None):
    """The findings (causes first, ``cockpit_lite.diagnosis.precedence``) of set-up ``name`` of ``suite`` on
    ``seed``, with the fix ``FIXES`` gives for the finding ``fix`` applied; raises ``NotApplicable`` for a fix
    that does not apply."""
    spec = SUITES[suite][name]
    if fix is not None:
        spec = FIXES[fix.kind](spec, fix)
    if suite == "toy":
        return bn.train(name, seed, scenario=spec).findings
    return rd.train(name, seed, recipe=spec)[0].findings


def kinds(found):
    """The kinds of the warnings and errors among ``found``, in the report's order (each once)."""
    out = []
    for f in found:
        if f.severity != "info" and f.kind not in out:
            out.append(f.kind)
    return out


def measure(seeds, suites=tuple(SUITES), names=None):
    """``[{suite, scenario, seed, findings, fixes: {kind: kinds left, or None where the fix does not apply}}]``
    for each run of a faulty set-up that reports more than one kind (warning or error)."""
    rows = []
    for suite in suites:
        for name, spec in SUITES[suite].items():
            if spec.expect is None or (names and name not in names):
                continue
            for seed in range(seeds):
                run = findings(suite, name, seed)
                found = kinds(run)
                if len(found) < 2:
                    continue
                fixes = {}
                for kind in found:
                    if kind in FIXES:
                        try:
                            fixes[kind] = kinds(findings(suite, name, seed, next(f for f in run if f.kind == kind)))
                        except NotApplicable:
                            fixes[kind] = None
                rows.append({"suite": suite, "scenario": name, "seed": seed, "findings": found, "fixes": fixes})
    return rows


def pairs(rows):
    """``{(consequence, cause): (runs where the cause's fix cleared the consequence, runs with both and a fix for
    the cause)}`` over ``rows``."""
    out = {}
    for row in rows:
        for cause, left in row["fixes"].items():
            if left is None:
                continue
            for consequence in row["findings"]:
                if consequence != cause:
                    cleared, both = out.get((consequence, cause), (0, 0))
                    out[consequence, cause] = (cleared + (consequence not in left), both + 1)
    return out


def table(rows):
    """``{header, rows}``: one row per pair whose cause's fix cleared the consequence at least once."""
    found = pairs(rows)
    out = []
    for (consequence, cause), (cleared, both) in sorted(found.items(), key=lambda item: (-item[1][0], item[0])):
        if cleared:
            back, back_both = found.get((cause, consequence), (0, 0))
            out.append([f"`{consequence}`", f"`{cause}`", f"{cleared} of {both}",
                        f"{back} of {back_both}" if back_both else "– (no fix)"])
    total, cleared = summary(rows)
    out.append(["**the finding listed first**", "", f"**its fix clears the run in {cleared} of {total}**", ""])
    return {"header": ["consequence", "cause", "the cause's fix cleared it (runs)",
                       "the consequence's fix cleared the cause (runs)"], "rows": out}


def summary(rows):
    """``(runs, runs whose first-listed kind has a fix that clears every warning and error)``."""
    cleared = sum(1 for row in rows if row["fixes"].get(row["findings"][0]) == [])
    return len(rows), cleared


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.precedence", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--suite", nargs="+", choices=list(SUITES), default=list(SUITES))
    parser.add_argument("--only", nargs="+", help="set-ups (default: every faulty one)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--numbers", action="store_true", help="write the pairs into docs/numbers.json")
    parser.add_argument("--rows", help="instead of training: read the rows a --json run wrote")
    args = parser.parse_args(argv)
    bn.single_thread()
    import logging

    logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)
    if args.rows:
        with open(args.rows, encoding="utf-8") as file:
            rows = json.load(file)
    else:
        rows = measure(args.seeds, args.suite, args.only)
    print("suite | scenario | seed | findings (report order) | fix applied -> warnings/errors left")
    for row in rows:
        fixes = "; ".join(f"{k} -> {'n/a' if v is None else ', '.join(v) or 'none'}" for k, v in row["fixes"].items())
        print(f"{row['suite']} | {row['scenario']} | {row['seed']} | {', '.join(row['findings'])} | {fixes}")
    total, cleared = summary(rows)
    print(f"\nmulti-finding runs: {total}; the first-listed finding's fix clears the run: {cleared}")
    for row in table(rows)["rows"]:
        print(" | ".join(row))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(rows, file, indent=1)
    if args.numbers:
        from experiments.seed_stability import write_numbers

        write_numbers("precedence", f"python -m experiments.precedence --seeds {args.seeds}", table(rows))
    return rows


if __name__ == "__main__":
    main()
