"""Which finding is the cause: apply each finding's fix alone and see which one clears the run.

    python -m experiments.precedence [--seeds 5] [--json PATH]

For every set-up that reports more than one finding (the multi-finding scenarios of
``experiments.broken_networks`` and the README's first example: inputs on a 0..255
scale under SGD at 0.1), on each seed, the run is repeated once per reported kind with
that kind's fix applied alone (``FIXES``: what its suggestion says, made concrete). A
fix that leaves no finding removed the cause: its kind is the *root* and the kinds it
cleared with it are its consequences. The table is what ``cockpit_lite.diagnosis.
precedence`` orders by; docs/diagnosis.md shows it.
"""

import argparse
import dataclasses
import json

import torch
from torch import nn

from experiments import broken_networks as bn


def _scaled_lr(make_optimizer, factor):
    def make(params):
        optimizer = make_optimizer(params)
        for group in optimizer.param_groups:
            group["lr"] *= factor
        return optimizer

    return make


def _standardised(data):
    (x, y), (xv, yv) = data
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


def _built(change):
    """A fix that changes what a scenario builds: ``change(model, data, optimizer factory)``."""
    return lambda scenario: dataclasses.replace(scenario, build=lambda s, build=scenario.build: change(*build(s)))


FIXES = {
    "lr_too_high": _built(lambda m, d, o: (m, d, _scaled_lr(o, 0.1))),  # "lower the learning rate (by 3-10x)"
    "edge_of_stability": _built(lambda m, d, o: (m, d, _scaled_lr(o, 0.5))),  # "lower the learning rate below ..."
    "lr_too_low": _built(lambda m, d, o: (m, d, _scaled_lr(o, 10.0))),  # "raise the learning rate (by about 10x)"
    "unnormalized_inputs": _built(lambda m, d, o: (m, _standardised(d), o)),  # "standardise the inputs"
    "dead_relu": _built(lambda m, d, o: (_leaky(m), d, o)),  # "... or use LeakyReLU/GELU"
    "saturated_activations": _built(lambda m, d, o: (_xavier(m), d, o)),  # "scale the initialisation down (Xavier)"
    "noise_dominates": lambda scenario: dataclasses.replace(scenario, batch=16 * scenario.batch),  # "increase the batch"
}
"""``kind -> Scenario -> the same scenario with that finding's suggested fix applied``."""


def _readme_example(seed):
    """README's first example on a set-up of this suite: 0..255 inputs, SGD at 0.1 (one fixed batch there)."""
    return bn.mlp([16], n_in=8, n_out=3), _uniform_255(seed), bn.sgd(0.1)


def _uniform_255(seed):
    g = torch.Generator().manual_seed(seed + 11)
    x, y = 255 * torch.rand(320, 8, generator=g), torch.randint(0, 3, (320,), generator=g)
    return (x[:256], y[:256]), (x[256:], y[256:])


EXTRA = {"readme_255_sgd": bn.Scenario(_readme_example, ("unnormalized_inputs", None), batch=64, steps=20)}
"""Set-ups beside ``broken_networks.SCENARIOS``."""


EVIDENCE = {
    ("dead_relu", "unnormalized_inputs"): ("unnormalized_offset_synthetic", 0),
    ("dead_relu", "lr_too_high"): ("lr_too_high_sgd", 0),
    ("lr_too_high", "unnormalized_inputs"): ("readme_255_sgd", 0),
    ("lr_too_low", "saturated_activations"): ("saturated_sigmoid_synthetic", 0),
    ("nan_loss", "lr_too_high"): ("nan_handwritten_bce", 3),
    ("edge_of_stability", "lr_too_high"): ("edge_of_stability_gd", 0),
}
"""``(consequence, cause) -> (scenario, seed)``: a run on which the cause's fix cleared the consequence,
one per pair of ``cockpit_lite.diagnosis.precedence.CAUSES`` (the test re-runs each)."""


def kinds(name, seed, fix=None):
    """The kinds of finding scenario ``name`` (of ``broken_networks`` or ``EXTRA``) reports on ``seed``,
    with ``fix``'s ``FIXES`` entry applied."""
    scenario = {**bn.SCENARIOS, **EXTRA}[name]
    if fix is not None:
        scenario = FIXES[fix](scenario)
    return sorted({f.kind for f in bn.train(name, seed, scenario=scenario).findings})


def measure(seeds, names=None):
    """``[{scenario, seed, findings, fixes: {kind: kinds left}}]`` for each multi-finding run."""
    rows = []
    for name in names or [*bn.SCENARIOS, *EXTRA]:
        if name.startswith("healthy"):
            continue
        for seed in range(seeds):
            found = kinds(name, seed)
            if len(found) < 2:
                continue
            fixes = {kind: kinds(name, seed, kind) for kind in found if kind in FIXES}
            rows.append({"scenario": name, "seed": seed, "findings": found, "fixes": fixes})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.precedence", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", nargs="+", help="scenarios (default: all faulty ones)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    bn.single_thread()
    rows = measure(args.seeds, args.only)
    print("scenario | seed | findings | fix applied -> findings left")
    for row in rows:
        fixes = "; ".join(f"{k} -> {', '.join(v) or 'none'}" for k, v in row["fixes"].items())
        print(f"{row['scenario']} | {row['seed']} | {', '.join(row['findings'])} | {fixes}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
