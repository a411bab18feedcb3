"""Are the subsampled estimates (``Cockpit(samples=k)``) honest? Estimates against exact values over many draws.

Usage::

    python -m experiments.subsample_honesty [--draws 100] [--samples 8 32] [--batch 64] [--json PATH]

For each model of the realistic diagnosis suite (``experiments.realistic_diagnosis``: a
character GPT with tied embeddings, an LSTM language model, a ViT, a ResNet with
BatchNorm in training mode, an MLP), at one point of training (the recipe's model and
optimizer after ``--warmup`` plain steps), one batch of ``--batch`` samples is measured
exactly (``samples=None``) and then ``--draws`` times with ``samples=k`` (Cockpit seeds
0, 1, ...), two steps each from the same state (``Alpha`` needs the step after). For every
value of every quantity (the whole network and each layer) it reports:

- ``|z| ≤ 3``: the fraction of draws with ``|estimate − exact| ≤ 3 se``;
- ``max bias/SEM``: the largest ``|mean over draws − exact|`` over the standard error of
  that mean (``sd / √draws``), over the quantity's values;
- ``median se/sd``: the median over values of (mean recorded se) / (sd of the estimates
  over draws): 1 when the standard errors are right on average.

Histograms have no standard error per bin: their row reports the bias of the total
count only.
"""

import copy
import math
import warnings

import numpy as np
import torch

from cockpit_lite import Cockpit
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


def quantities():
    return [NormTest(), InnerTest(), OrthoTest(), GradVariance(), Alpha(), GradHist1d()]


def setup(name, batch, warmup, seed=0):
    """The recipe's model and optimizer after ``warmup`` plain steps, and two batches of ``batch`` samples."""
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

    def loss_of(x, y):
        out = model(x)
        if recipe.task == "chars":
            return recipe.loss(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        return recipe.loss(out, y)

    for _ in range(warmup):
        x, y = draw_batch()
        optimizer.zero_grad()
        loss_of(x, y).backward()
        optimizer.step()
    return model, optimizer, loss_of, [draw_batch(), draw_batch()]


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


def values_of(entry, name):
    """``(values, ses)`` of one quantity at one step: the whole network's first, then the layers'."""
    meta = entry.get("meta", {}).get(name) or {}
    if name == "GradVariance":
        values, ses = list(entry[name]), list(meta.get("se", [math.nan] * len(entry[name])))
        return [sum(values)] + values, [meta.get("total_se", math.nan)] + ses
    if name == "Alpha":
        return [entry[name]], [meta.get("se", math.nan)]
    return [entry[name]] + list(entry["layers"][name]), [meta.get("se", math.nan)] + list(meta.get("layers_se", []))


def summarise(exact, draws):
    """Rows ``{quantity: {"inside", "bias", "se_ratio", "values"}}`` for one model and k."""
    rows = {}
    for name, step in [(n, 0) for n in SCALARS + ("GradVariance",)] + [("Alpha", 0)]:
        truth, _ = values_of(exact[step], name)
        estimates = np.array([values_of(d[step], name)[0] for d in draws], float)
        ses = np.array([values_of(d[step], name)[1] for d in draws], float)
        truth = np.array(truth, float)
        keep = np.isfinite(truth) & np.isfinite(estimates).all(0)
        if name == "Alpha":  # −1, a concave fit, is no position on a parabola: nothing to estimate
            keep &= truth != -1.0
        if not keep.any():
            continue
        estimates, ses, truth = estimates[:, keep], ses[:, keep], truth[keep]
        sd = estimates.std(0, ddof=1)
        sem = sd / math.sqrt(len(draws))
        rows[name] = {
            "inside": float(np.mean(np.abs(estimates - truth) <= 3 * ses)),
            "bias": float(np.max(np.abs(estimates.mean(0) - truth) / np.maximum(sem, 1e-300))),
            "se_ratio": float(np.median(ses.mean(0) / np.maximum(sd, 1e-300))),
            "values": int(keep.sum()),
        }
    totals = np.array([d[0]["GradHist1d"]["hist"].sum() for d in draws])
    exact_total = float(exact[0]["GradHist1d"]["hist"].sum())
    sem = totals.std(ddof=1) / math.sqrt(len(draws))
    rows["GradHist1d (total count)"] = {
        "inside": math.nan, "bias": abs(totals.mean() - exact_total) / max(sem, 1e-300) if sem > 0 else 0.0,
        "se_ratio": math.nan, "values": 1,
    }
    return rows


def main(argv=None):
    parser = common.parser("subsample_honesty", __doc__)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--samples", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    common.single_thread()
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in args.models:
            model, optimizer, loss_of, batches = setup(name, args.batch, args.warmup)
            exact = record(model, optimizer, loss_of, batches)
            for k in args.samples:
                draws = [record(model, optimizer, loss_of, batches, samples=k, seed=s) for s in range(args.draws)]
                results[f"{name} k={k}"] = summarise(exact, draws)
                print(f"{name} k={k}: done", flush=True)
    print(f"\n{args.draws} draws of k of {args.batch} samples; |z|<=3: fraction of draws within 3 se of the exact "
          "value (all values: network and layers); bias/SEM: largest |mean - exact| / (sd/sqrt(draws)); "
          "se/sd: median of mean se over the sd of the estimates")
    print(f"{'model':<16}{'quantity':<26}{'values':>7}{'|z|<=3':>9}{'bias/SEM':>10}{'se/sd':>8}")
    for key, rows in results.items():
        for quantity, row in rows.items():
            print(f"{key:<16}{quantity:<26}{row['values']:>7}{row['inside']:>9.3f}{row['bias']:>10.2f}"
                  f"{row['se_ratio']:>8.2f}")
    if args.json:
        common.write_json(args.json, results)


if __name__ == "__main__":
    main()
