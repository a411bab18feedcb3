"""Vanishing gradients hidden in the whole-network histogram: the Cockpit paper's Figure 4.

    python -m experiments.vanishing_gradients [--widths 64 64 64 64] [--range 0.05] [--bins 101]
                                              [--epochs 8] [--lr 0.3] [--out runs/vanishing_gradients] [--tiny]

The same 5-layer MLP (64-64-64-64-64-10 on scikit-learn's digits, identical initial
weights) once with ReLU and once with sigmoid activations. At the first step
(as in the paper: the initial network, before any update) cockpit-lite tracks
``GradHist1d(per_layer=True)`` (histogram of every individual-gradient element
g_{n,d}, whole network and per parameter tensor), ``GradNorm`` and
``GradVariance``. From the last two the exact root-mean-square of a layer's
individual-gradient elements follows (``experiments.common.rms_individual_gradient``).

Reading. The whole-network histograms of both nets look alike (a peak at 0 with
tails), but the per-layer ones show that the sigmoid net's first layers are
degenerate: all their gradient elements fall into the central bin, because each
sigmoid layer multiplies the back-propagated signal by σ' ≤ 1/4 — the gradient
vanishes towards the input. Both nets are then trained for ``--epochs`` with the
same SGD learning rate to show the consequence (the sigmoid net barely learns).

Figure: rows = activation, columns = whole network + each layer's weight
histogram (biases are in the whole-network histogram), titles with the per-layer
RMS gradient element, ‖g‖ and the fraction of elements in the central bin; a bottom
row with the RMS per layer (log scale) and the loss curves. Writes
``OUT/vanishing_gradients.png`` and ``OUT/vanishing_gradients.json``.
"""

import math
import os

import numpy as np
import torch
from torch import nn

from cockpit_lite import Cockpit, extend, quantities
from experiments import common

NAME = "vanishing_gradients"
ACTIVATIONS = {"ReLU": nn.ReLU, "sigmoid": nn.Sigmoid}
COLORS = {"ReLU": "#1f77b4", "sigmoid": "#d62728"}


def train(activation, args, data):
    """Track the histograms at step 0, then train; return ``(record, names, shapes, curve)``."""
    (x_train, y_train), test = data
    torch.manual_seed(args.seed)  # same seed and shapes: identical initial weights for both activations
    model = extend(common.mlp(args.widths, ACTIVATIONS[activation]))
    lossfunc = extend(nn.CrossEntropyLoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    def at_start(step):
        return step == 0

    cp = Cockpit(model.named_parameters(), quantities=[
        quantities.GradHist1d(track_schedule=at_start, bins=args.bins, range=(-args.range, args.range),
                              per_layer=True),
        quantities.GradNorm(track_schedule=at_start),
        quantities.GradVariance(track_schedule=at_start),
        quantities.Loss(),
    ])
    batches = torch.Generator().manual_seed(args.seed + 1)
    curve = {"step": [], "loss": [], "epoch_step": [], "test_accuracy": [], "train_loss": []}
    step = 0
    for epoch in range(args.epochs):
        for index in common.minibatches(len(y_train), args.batch_size, batches):
            if args.max_steps is not None and step >= args.max_steps:
                break
            optimizer.zero_grad()
            loss = lossfunc(model(x_train[index]), y_train[index])
            with cp(step, info={"loss": loss, "optimizer": optimizer, "batch_size": args.batch_size}):
                loss.backward()
            optimizer.step()
            curve["step"].append(step)
            curve["loss"].append(loss.item())
            step += 1
        train_loss, _ = common.evaluate(model, data[0])
        _, test_acc = common.evaluate(model, test)
        curve["epoch_step"].append(step)
        curve["train_loss"].append(train_loss)
        curve["test_accuracy"].append(test_acc)
    cp.close()
    names = [n for n, _ in model.named_parameters()]
    shapes = [tuple(p.shape) for p in model.parameters()]
    return cp.get_output(), names, shapes, curve


def layer_stats(record, names, shapes, batch_size):
    """Per weight tensor and whole network: RMS element, ‖g‖, clipped and central-bin fractions, binned σ."""
    entry = record[0]
    hists = entry["layers"]["GradHist1d"]
    norms, variances = entry["GradNorm"], entry["GradVariance"]

    def central_fraction(hist):
        counts = np.asarray(hist["hist"], dtype=float)
        edges = np.asarray(hist["edges"], dtype=float)
        centre = int(np.searchsorted(edges, 0.0, side="right") - 1)
        return float(counts[centre] / counts.sum()) if counts.sum() else float("nan")

    layers = []
    for i, (name, shape) in enumerate(zip(names, shapes)):
        if not name.endswith("weight"):
            continue
        numel = int(np.prod(shape))
        n, clipped, std = common.histogram_stats(hists[i])
        layers.append({
            "name": name,
            "shape": list(shape),
            "index": i,
            "rms_gradient_element": common.rms_individual_gradient(norms[i], variances[i], numel, batch_size),
            "grad_norm": norms[i],
            "clipped_fraction": clipped,
            "central_bin_fraction": central_fraction(hists[i]),
            "binned_std": std,
        })
    total = entry["GradHist1d"]
    numel = sum(int(np.prod(s)) for s in shapes)
    rms_total = math.sqrt(sum(
        common.rms_individual_gradient(norms[i], variances[i], int(np.prod(s)), batch_size) ** 2 * int(np.prod(s))
        for i, s in enumerate(shapes)) / numel)
    n, clipped, std = common.histogram_stats(total)
    whole = {"rms_gradient_element": rms_total, "grad_norm": math.sqrt(sum(v**2 for v in norms)),
             "clipped_fraction": clipped, "central_bin_fraction": central_fraction(total), "binned_std": std}
    return layers, whole


def plot(results, args, path):
    from instruments import draw_gauge

    acts = list(results)
    n_layers = len(results[acts[0]]["layers"])
    fig = common.new_figure(3.0 * (n_layers + 1), 10.5)
    grid = fig.add_gridspec(3, n_layers + 1, height_ratios=[1, 1, 1.05])
    axes = [[fig.add_subplot(grid[r, c]) for c in range(n_layers + 1)] for r in range(2)]
    for r, act in enumerate(acts):
        res = results[act]
        record = res["record"]
        ax = axes[r][0]
        draw_gauge("histogram_1d", record, ax, step=0)
        w = res["whole"]
        ax.set_title(f"{act}: WHOLE NETWORK\nrms {w['rms_gradient_element']:.1e} · binned σ {w['binned_std']:.1e}\n"
                     f"{w['central_bin_fraction']:.0%} in centre bin · {w['clipped_fraction']:.1%} clipped",
                     fontsize=9.5, fontweight="bold", color=COLORS[act])
        for c, layer in enumerate(res["layers"], start=1):
            ax = axes[r][c]
            draw_gauge("histogram_1d", record, ax, step=0, layer=layer["index"])
            degenerate = layer["central_bin_fraction"] > 0.9
            ax.set_title(
                f"{act}: layer {c} weight {layer['shape'][0]}×{layer['shape'][1]}\n"
                f"rms {layer['rms_gradient_element']:.1e} · ‖g‖ {layer['grad_norm']:.1e}\n"
                f"{layer['central_bin_fraction']:.0%} in centre bin"
                + (f" · {layer['clipped_fraction']:.0%} clipped" if layer["clipped_fraction"] >= 0.005 else ""),
                fontsize=9.5, fontweight="bold" if degenerate else "normal",
                color="#d62728" if degenerate else "k")
            if degenerate:
                ax.text(0.5, 0.5, "collapsed\nto ~0", transform=ax.transAxes, ha="center", va="center",
                        fontsize=13, color="#d62728", alpha=0.55, fontweight="bold")
    ticks = [-args.range, -args.range / 2, 0, args.range / 2, args.range]
    for c in range(n_layers + 1):  # one y range per column, so that the two activations compare directly
        tops = [axes[r][c].get_ylim()[1] for r in range(2)]
        for r in range(2):
            axes[r][c].set_ylim(0.7, max(tops))
            axes[r][c].set_xticks(ticks, [f"{t:g}" for t in ticks])
            axes[r][c].set_xlabel("gradient element g_n,d", fontsize=8.5)
            if c:
                axes[r][c].set_ylabel("")

    ax_rms = fig.add_subplot(grid[2, : (n_layers + 1) // 2])
    ax_loss = fig.add_subplot(grid[2, (n_layers + 1) // 2:])
    x = np.arange(1, n_layers + 1)
    width = 0.38
    for k, act in enumerate(acts):
        rms = [layer["rms_gradient_element"] for layer in results[act]["layers"]]
        bars = ax_rms.bar(x + (k - 0.5) * width, rms, width, color=COLORS[act], label=act)
        for bar, v in zip(bars, rms):
            ax_rms.text(bar.get_x() + bar.get_width() / 2, v * 1.15, f"{v:.0e}", ha="center", fontsize=7.5)
    bin_width = 2 * args.range / args.bins
    ax_rms.axhline(bin_width / 2, color="k", ls=":", lw=0.8, label=f"half a histogram bin ({bin_width / 2:.0e})")
    ax_rms.set_yscale("log")
    ax_rms.set_xticks(x, [f"layer {i}\n(input side)" if i == 1 else f"layer {i}" for i in x])
    ax_rms.set_ylabel("rms individual-gradient element")
    first = [results[act]["layers"][0]["rms_gradient_element"] for act in ("ReLU", "sigmoid")]
    ratio = first[0] / first[1]
    ax_rms.set_title(f"per-layer gradient scale at step 0: sigmoid's layer 1 is {ratio:.0f}× smaller than ReLU's",
                     fontsize=10)
    ax_rms.legend(fontsize=8.5)

    for act in acts:
        curve = results[act]["curve"]
        y = np.asarray(curve["loss"])
        window = min(20, len(y))
        smooth = np.convolve(y, np.ones(window) / window, mode="valid") if len(y) else y
        ax_loss.plot(curve["step"], y, color=COLORS[act], alpha=0.25, lw=0.8)
        ax_loss.plot(curve["step"][window - 1:], smooth, color=COLORS[act], lw=2,
                     label=f"{act}: final train loss {curve['train_loss'][-1]:.2f}, "
                           f"test acc {curve['test_accuracy'][-1]:.0%}")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("mini-batch loss")
    ax_loss.legend(fontsize=8.5)
    ax_loss.set_title(f"consequence: same SGD (lr {args.lr:g}, batch {args.batch_size}, {args.epochs} epochs)",
                      fontsize=10)

    fig.suptitle(
        f"Vanishing gradients: MLP 64-{'-'.join(map(str, args.widths))}-10 on digits, identical initial weights, "
        f"GradHist1d(per_layer=True) at step 0 over ±{args.range:g} ({args.bins} bins; out-of-range values in the "
        "red edge bins).\nThe whole-network histograms look alike; the per-layer ones show the sigmoid net's "
        "input-side layers collapsed to ~0 (cf. Cockpit paper Fig. 4)", fontsize=11)
    return common.save_figure(fig, path)


def main(argv=None):
    p = common.parser(NAME, __doc__)
    p.add_argument("--widths", type=int, nargs="+", default=[64, 64, 64, 64], help="hidden layer widths")
    p.add_argument("--range", type=float, default=0.05, help="histogram range ±R")
    p.add_argument("--bins", type=int, default=101, help="number of bins (odd: a bin centred on 0)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-steps", type=int, default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.epochs, args.max_steps = 1, 5
    common.single_thread()
    data = common.load_digits_tensors(seed=args.seed, scaling="unit")
    results = {}
    for act in ACTIVATIONS:
        record, names, shapes, curve = train(act, args, data)
        layers, whole = layer_stats(record, names, shapes, args.batch_size)
        results[act] = {"record": record, "layers": layers, "whole": whole, "curve": curve}
        print(f"{act:8s} whole: rms {whole['rms_gradient_element']:.2e}, centre bin "
              f"{whole['central_bin_fraction']:.0%} | per layer rms: "
              + ", ".join(f"{layer['rms_gradient_element']:.1e}" for layer in layers)
              + f" | final train loss {curve['train_loss'][-1]:.3f}, test acc {curve['test_accuracy'][-1]:.1%}")
    relu, sig = results["ReLU"], results["sigmoid"]
    ratios = [a["rms_gradient_element"] / b["rms_gradient_element"] for a, b in zip(relu["layers"], sig["layers"])]
    collapsed = [i + 1 for i, layer in enumerate(sig["layers"]) if layer["central_bin_fraction"] > 0.9]
    collapsed_relu = [i + 1 for i, layer in enumerate(relu["layers"]) if layer["central_bin_fraction"] > 0.9]
    conclusion = (
        f"Whole network: {relu['whole']['central_bin_fraction']:.0%} (ReLU) vs "
        f"{sig['whole']['central_bin_fraction']:.0%} (sigmoid) of the gradient elements in the central bin, "
        f"rms {relu['whole']['rms_gradient_element']:.1e} vs {sig['whole']['rms_gradient_element']:.1e}: "
        "both a peak at 0 with tails. Per layer the rms ratio ReLU/sigmoid is "
        + ", ".join(f"{r:.2g}×" for r in ratios)
        + " from the input to the output layer; the sigmoid net's layers "
        + (", ".join(map(str, collapsed)) if collapsed else "(none)")
        + " have > 90% of their elements in the central bin (collapsed"
        + (f"; ReLU: layers {', '.join(map(str, collapsed_relu))}" if collapsed_relu else "; ReLU: none")
        + f"). After {args.epochs} epochs: train loss {relu['curve']['train_loss'][-1]:.2f} (ReLU) vs "
        f"{sig['curve']['train_loss'][-1]:.2f} (sigmoid), test accuracy {relu['curve']['test_accuracy'][-1]:.0%} vs "
        f"{sig['curve']['test_accuracy'][-1]:.0%}."
    )
    print(conclusion)
    os.makedirs(args.out, exist_ok=True)
    png = plot(results, args, os.path.join(args.out, f"{NAME}.png"))
    summary = {
        "experiment": NAME,
        "config": {"widths": args.widths, "range": args.range, "bins": args.bins, "epochs": args.epochs,
                   "lr": args.lr, "batch_size": args.batch_size, "seed": args.seed, "tracked_step": 0,
                   "tiny": args.tiny},
        "activations": {
            act: {
                "whole_network": res["whole"],
                "layers": res["layers"],
                "final_train_loss": res["curve"]["train_loss"][-1],
                "test_accuracy": res["curve"]["test_accuracy"][-1],
                "epoch_train_loss": res["curve"]["train_loss"],
                "epoch_test_accuracy": res["curve"]["test_accuracy"],
            }
            for act, res in results.items()
        },
        "rms_ratio_relu_over_sigmoid": ratios,
        "sigmoid_collapsed_layers": collapsed,
        "relu_collapsed_layers": collapsed_relu,
        "conclusion": conclusion,
        "figure": png,
    }
    return common.report(args.out, NAME, summary)


if __name__ == "__main__":
    main()
