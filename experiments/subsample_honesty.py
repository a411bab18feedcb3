"""Are the estimates and their intervals honest? Estimates against exact values over many draws.

Usage::

    python -m experiments.subsample_honesty [--draws 100] [--samples 8 32] [--batch 64] [--states 1]
        [--coverage 0.9973] [--probes 16] [--json PATH]

For each model of the realistic diagnosis suite (``experiments.realistic_diagnosis``: a
character GPT with tied embeddings, an LSTM language model, a ViT, a ResNet with
BatchNorm in training mode, an MLP), at ``--states`` points of training (the recipe's model
and optimizer, built from seeds 0, 1, ..., after ``--warmup`` plain steps), one batch of
``--batch`` samples is measured exactly (``samples=None``) and then ``--draws`` times with
``samples=k`` (Cockpit seeds 0, 1, ...), two steps each from the same state (``Alpha`` needs
the step after); the values of both steps are measured (``Alpha``'s once). With ``--probes K`` it also draws Hutchinson's ``HessTrace`` of ``K`` probes
``--draws`` times at the first batch and compares it with a reference of ``--reference``
probes (whose standard error is ``sqrt(K / reference)`` of the estimates': it widens the
spread of the errors by a factor ``sqrt(1 + K / reference)``, and the bias is measured against
the standard error of the mean and the reference's together). For every value of
every quantity (the whole network and each layer) it reports, pooled over the states:

- ``beyond 3 se``: the fraction of draws with ``|estimate − exact| > 3 se``, the symmetric
  normal test the standard error alone suggests;
- ``outside``: the fraction of draws whose interval at ``--coverage`` (default 0.9973, the
  coverage of ±3 standard errors of a normal estimate) misses the exact value: the record's
  ``"df"`` and ``"scale"`` through ``cockpit_lite.intervals``, ``Alpha``'s recorded
  ``"interval"`` (computed at that coverage: the experiment sets ``intervals.COVERAGE``);
- ``low``: the share of those misses where the estimate lies below the exact value;
- ``missed top``: for the gradient tests and ``GradVariance``, the share of those misses whose
  draw did not hold the sample with the largest per-sample term of that value (brute-force
  individual gradients; ``subsample.draw`` gives each draw's samples), and ``top share``, the
  median share of that sample's term in the batch's total over the missed values;
- ``bias/SEM``: the largest ``|mean over draws − exact|`` over the standard error of that mean
  (``sd / √draws``), over the quantity's values and the states;
- ``se/sd``: the median over values of (mean recorded se) / (sd of the estimates over draws).

Histograms have no standard error per bin: their row reports the bias of the total
count only.
"""

import copy
import math
import time
import warnings

import numpy as np
import torch

from cockpit_lite import Cockpit, intervals, subsample
from cockpit_lite.curvature import derivatives, hutchinson
from cockpit_lite.curvature.hvp import HessianVectorProducts
from cockpit_lite.quantities import Alpha, GradHist1d, GradVariance, InnerTest, NormTest, OrthoTest
from experiments import common
from experiments import realistic_diagnosis as suite

MODELS = {
    "char_gpt": "gpt_adamw_warmup_cosine",
    "lstm_lm": "lstm_lm_clipped",
    "vit": "vit_zero_cls_token",
    "resnet_bn": "resnet_bn_sgd_onecycle",
    "mlp": "label_smoothing_dropout",
}
"""Row name -> recipe whose model, data and optimizer are measured."""

SCALARS = ("NormTest", "InnerTest", "OrthoTest")
ESTIMATED = SCALARS + ("GradVariance", "Alpha")


def quantities():
    return [NormTest(), InnerTest(), OrthoTest(), GradVariance(), Alpha(), GradHist1d()]


def setup(name, batch, warmup, seed=0):
    """The recipe's model and optimizer after ``warmup`` plain steps, ``loss_of(x, y)``, the
    criterion on the model's outputs, and two batches of ``batch`` samples."""
    recipe = suite.RECIPES[MODELS[name]]
    torch.manual_seed(seed)
    model, data, make_optimizer = recipe.build(seed)
    model.eval() if any(isinstance(m, torch.nn.Dropout) for m in model.modules()) else model.train()
    optimizer = make_optimizer(model.parameters())
    generator = torch.Generator().manual_seed(seed + 3)
    train_data, _ = data

    def draw_batch():
        if recipe.task == "chars":
            return suite.char_batch(train_data, batch, 32, generator)
        x, y = train_data
        index = torch.randint(0, len(x), (batch,), generator=generator)
        return x[index], y[index]

    def criterion(out, y):
        if recipe.task == "chars":
            return recipe.loss(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        return recipe.loss(out, y)

    def loss_of(x, y):
        return criterion(model(x), y)

    for _ in range(warmup):
        x, y = draw_batch()
        optimizer.zero_grad()
        loss_of(x, y).backward()
        optimizer.step()
    return model, optimizer, loss_of, criterion, [draw_batch(), draw_batch()]


def record(model, optimizer, loss_of, batches, **cockpit_kwargs):
    """Two steps from the given state (restored afterwards); the record."""
    saved = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    cp = Cockpit(model, quantities(), diagnose=False, **cockpit_kwargs)
    for step, (x, y) in enumerate(batches):
        optimizer.zero_grad()
        loss = loss_of(x, y)
        with cp(step, info={"loss": loss, "optimizer": optimizer}):
            loss.backward()
        optimizer.step()
    cp.close()
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    return cp.get_output()


def per_sample_terms(model, criterion, batch):
    """``{quantity: [B, 1 + L]}``: each sample's term ``x_n`` of the totals the gradient tests and
    ``GradVariance`` estimate by ``(B/k) Σ_{n∈S} x_n`` (``‖g̃_n‖²``, ``(g̃_nᵀg − ‖g‖²)²``,
    ``‖g̃_n‖² − (g̃_nᵀg)²/‖g‖²``; the whole network's, then each parameter's), from brute-force
    individual gradients (one forward pass, ``autograd.grad`` of each sample's loss, whose mean
    is the batch loss)."""
    x, y = batch
    params = [p for p in model.parameters() if p.requires_grad]
    saved = copy.deepcopy(model.state_dict())  # BatchNorm's running statistics
    out = model(x)
    rows = []
    for n in range(len(x)):
        grads = torch.autograd.grad(criterion(out[n : n + 1], y[n : n + 1]), params, retain_graph=True,
                                    allow_unused=True)
        rows.append(torch.cat([torch.zeros(p.numel()) if g is None else g.detach().reshape(-1).double()
                               for p, g in zip(params, grads)]))
    model.load_state_dict(saved)
    individual = torch.stack(rows)
    sizes = [p.numel() for p in params]
    blocks = [individual] + list(individual.split(sizes, dim=1))
    l2 = torch.stack([(b**2).sum(1) for b in blocks], 1)
    dots = torch.stack([b @ b.mean(0) for b in blocks], 1)
    g2 = torch.stack([b.mean(0) @ b.mean(0) for b in blocks])
    return {"NormTest": l2.numpy(), "GradVariance": l2.numpy(), "InnerTest": ((dots - g2) ** 2).numpy(),
            "OrthoTest": (l2 - dots**2 / g2).numpy()}


def values_of(entry, name, coverage):
    """``(values, ses, lows, highs)`` of one quantity at one step (the whole network's first, then
    the layers'), the interval at ``coverage`` (``Alpha``: the one it recorded)."""
    meta = entry.get("meta", {}).get(name) or {}
    if name == "GradVariance":
        values = [sum(entry[name])] + list(entry[name])
        ses = [meta.get("total_se", math.nan)] + list(meta.get("se", [math.nan] * len(entry[name])))
    elif name == "Alpha":
        values, ses = [entry[name]], [meta.get("se", math.nan)]
        low, high = meta.get("interval", [math.nan, math.nan])
        return values, ses, [low], [high]
    else:
        values = [entry[name]] + list(entry["layers"][name])
        ses = [meta.get("se", math.nan)] + list(meta.get("layers_se", []))
    low, high = intervals.interval(values, ses, meta.get("df"), coverage, meta.get("scale"))
    return values, ses, list(low), list(high)


def measure(truth, estimates, ses, lows, highs):
    """Per-value arrays of one quantity over ``[draws, values]`` against ``truth`` ``[values]``,
    finite values only (``Alpha``: not −1, a concave fit, which is no position to estimate)."""
    keep = np.isfinite(truth) & np.isfinite(estimates).all(0)
    estimates, ses, lows, highs, truth = estimates[:, keep], ses[:, keep], lows[:, keep], highs[:, keep], truth[keep]
    sd = estimates.std(0, ddof=1)
    return {
        "keep": keep,
        "beyond": np.abs(estimates - truth) > 3 * ses,
        "outside": (truth < lows) | (truth > highs),
        "low": estimates < truth,
        "z": np.abs(estimates - truth) / np.maximum(ses, 1e-300),
        "bias": np.abs(estimates.mean(0) - truth) / np.maximum(sd / math.sqrt(len(estimates)), 1e-300),
        "se_ratio": ses.mean(0) / np.maximum(sd, 1e-300),
    }


def state_rows(exact, draws, terms, drawn, coverage):
    """``{quantity: [measure(...) of each step]}`` of one state (with ``"top"``/``"share"`` where
    ``terms[step]`` has the per-sample terms; ``drawn[step]``: each draw's samples). Both steps of
    the record are measured, ``Alpha`` (the step between them) once."""
    out = {}
    for name in ESTIMATED:
        for step in (0,) if name == "Alpha" else (0, 1):
            truth = np.array(values_of(exact[step], name, coverage)[0], float)
            parts = [np.array([values_of(d[step], name, coverage)[i] for d in draws], float) for i in range(4)]
            if name == "Alpha":
                truth = np.where(truth == -1.0, np.nan, truth)
            m = measure(truth, *parts)
            if not m["keep"].any():
                continue
            if name in terms[step]:
                x = terms[step][name][:, m["keep"]]
                top = x.argmax(0)
                m["top"] = np.array([[t in rows for t in top] for rows in drawn[step]])  # [draws, values]
                m["share"] = x.max(0) / x.sum(0)
            out.setdefault(name, []).append(m)
    totals = np.array([d[0]["GradHist1d"]["hist"].sum() for d in draws])
    sem = totals.std(ddof=1) / math.sqrt(len(draws))
    out["GradHist1d (total count)"] = [{"bias": np.array([abs(totals.mean() - exact[0]["GradHist1d"]["hist"].sum())
                                                          / sem if sem > 0 else 0.0])}]
    return out


def stepped(model, optimizer, criterion, batch):
    """A copy of ``model`` after one plain step of a copy of ``optimizer`` on ``batch`` (the state
    at the record's second step)."""
    model, optimizer = copy.deepcopy((model, optimizer))
    optimizer.zero_grad()
    x, y = batch
    criterion(model(x), y).backward()
    optimizer.step()
    return model


def pooled(parts):
    """One row from the per-state ``measure`` dicts of a quantity."""
    row = {"values": int(sum(p["keep"].sum() for p in parts if "keep" in p)),
           "bias": float(max(p["bias"].max() for p in parts))}
    if "outside" not in parts[0]:
        return row
    cat = {key: np.concatenate([p[key].ravel() for p in parts]) for key in ("beyond", "outside", "low", "z")}
    missed = cat["outside"]
    row.update(beyond=float(cat["beyond"].mean()), outside=float(missed.mean()), max_z=float(cat["z"].max()),
               low=float(cat["low"][missed].mean()) if missed.any() else math.nan,
               se_ratio=float(np.median(np.concatenate([p["se_ratio"] for p in parts]))))
    if "top" in parts[0]:
        top = np.concatenate([p["top"].ravel() for p in parts])
        share = np.concatenate([np.broadcast_to(p["share"], p["top"].shape).ravel() for p in parts])
        row.update(missed_top=float((~top[missed]).mean()) if missed.any() else math.nan,
                   top_share=float(np.median(share[missed])) if missed.any() else math.nan,
                   outside_with_top=float(missed[top].mean()) if top.any() else math.nan)
    return row


def hutchinson_rows(model, loss_of, batch, probes, reference, draws):
    """Per-tensor and total Hessian traces: ``draws`` estimates of ``probes`` probes against the mean of
    ``reference`` probes (``measure`` at the recorded df)."""
    derivatives.enable()
    params = [p for p in model.parameters() if p.requires_grad]
    products = HessianVectorProducts(loss_of(*batch), params, 0)

    def traces(count, seed):
        estimate = hutchinson.DiagonalEstimate(products, count, torch.Generator().manual_seed(seed))
        stacked = lambda d: torch.stack([sum(x.sum() for x in d), *[x.sum() for x in d]])  # noqa: E731
        values, ses = stacked(estimate.diagonal), estimate.standard_error(stacked)
        return values.double().numpy(), ses.double().numpy(), estimate.degrees_of_freedom

    exact, exact_se, _ = traces(reference, 10**6)
    rows = [traces(probes, seed) for seed in range(draws)]
    values, ses, df = np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), rows[0][2]
    lows, highs = intervals.interval(values, ses, df, intervals.COVERAGE)
    m = measure(exact, values, ses, lows, highs)
    sd = values.std(0, ddof=1)[m["keep"]]  # the bias against the reference's own error too
    m["bias"] = np.abs(values.mean(0) - exact)[m["keep"]] / np.sqrt(sd**2 / draws + exact_se[m["keep"]] ** 2)
    m["reference_se"] = float(np.median(exact_se[m["keep"]] / np.maximum(sd, 1e-300)))
    return m


def main(argv=None):
    parser = common.parser("subsample_honesty", __doc__)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--samples", type=int, nargs="*", default=[8, 32])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--states", type=int, default=1, help="training states (model seeds) per model")
    parser.add_argument("--coverage", type=float, default=0.9973)
    parser.add_argument("--probes", type=int, default=0, help="Hutchinson's probes per draw (0: not measured)")
    parser.add_argument("--reference", type=int, default=4096, help="probes of Hutchinson's reference")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    common.single_thread()
    intervals.COVERAGE, before = args.coverage, intervals.COVERAGE  # Alpha records its interval at it
    results, started = {}, time.time()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in args.models:
                per_k, hutch = {k: [] for k in args.samples}, []
                for state in range(args.states):
                    model, optimizer, loss_of, criterion, batches = setup(name, args.batch, args.warmup, state)
                    if args.samples:
                        exact = record(model, optimizer, loss_of, batches)
                        after = stepped(model, optimizer, criterion, batches[0])
                        terms = [per_sample_terms(model, criterion, batches[0]),
                                 per_sample_terms(after, criterion, batches[1])]
                    for k in args.samples:
                        draws = [record(model, optimizer, loss_of, batches, samples=k, seed=s)
                                 for s in range(args.draws)]
                        drawn = [[set(subsample.draw(k, args.batch, (s, step)).tolist()) for s in range(args.draws)]
                                 for step in (0, 1)]
                        per_k[k].append(state_rows(exact, draws, terms, drawn, args.coverage))
                    if args.probes:
                        hutch.append(hutchinson_rows(model, loss_of, batches[0], args.probes, args.reference,
                                                     args.draws))
                    print(f"{name} state {state}: done ({time.time() - started:.0f} s)", flush=True)
                for k, states in per_k.items():
                    results[f"{name} k={k}"] = {q: pooled([m for s in states for m in s.get(q, [])])
                                                for q in dict.fromkeys(q for s in states for q in s)}
                if hutch:
                    results[f"{name} probes={args.probes}"] = {"HessTrace": pooled(hutch) | {
                        "reference_se": max(h["reference_se"] for h in hutch)}}
    finally:
        intervals.COVERAGE = before
    print(f"\n{args.draws} draws x {args.states} state(s), batch {args.batch}; beyond 3 se: |estimate - exact| > 3 se; "
          f"outside: the exact value outside the {100 * args.coverage:g} % interval; low: share of those below; "
          "missed top: share of those whose draw lacked the batch's largest per-sample term (top share: its median "
          "share of the total); bias/SEM: largest |mean - exact| / (sd/sqrt(draws)); se/sd: median mean se / sd "
          f"({time.time() - started:.0f} s)")
    print(f"{'model':<18}{'quantity':<26}{'values':>7}{'beyond3se':>10}{'outside':>9}{'low':>6}{'max|z|':>8}"
          f"{'missed top':>11}{'top share':>10}{'bias/SEM':>9}{'se/sd':>7}")
    for key, rows in results.items():
        for quantity, row in rows.items():
            cell = lambda name, fmt: format(row[name], fmt) if name in row else "-"  # noqa: E731
            print(f"{key:<18}{quantity:<26}{row['values']:>7}{cell('beyond', '10.3f'):>10}{cell('outside', '9.3f'):>9}"
                  f"{cell('low', '6.2f'):>6}{cell('max_z', '8.1f'):>8}{cell('missed_top', '11.2f'):>11}"
                  f"{cell('top_share', '10.2f'):>10}{row['bias']:>9.2f}{cell('se_ratio', '7.2f'):>7}")
    if args.json:
        common.write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
