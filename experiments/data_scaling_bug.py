"""A data pre-processing bug seen in the gradient histograms: the Cockpit paper's Figure 3.

    python -m experiments.data_scaling_bug [--lrs 0.01 0.1] [--epochs 10] [--out runs/data_scaling_bug] [--tiny]

The same MLP (64-64-64-10, ReLU, identical initial weights) on scikit-learn's digits,
once with normalised inputs (zero mean, unit variance) and once with the bug: the
pixels left in the 0..255 range of an image file. cockpit-lite tracks at the first
step (and every ``--hist-every`` steps) the histograms of the individual-gradient
elements, ``GradHist1d(per_layer=True)`` with its default range (−2, 2), and
``GradHist2d(per_layer=True)`` (gradient element × parameter value) over
(−2, 2) × (−0.25, 0.25) (the gradient range of the 1-d histogram; the parameter
range of this model's weights, like the paper's (−0.2, 0.2)), plus ``GradNorm`` and
``GradVariance`` (for the exact RMS gradient element of each layer), and the loss at
every step. Both inputs are trained with the same SGD learning rates ``--lrs``
(the histograms shown are the first learning rate's; at step 0 they do not depend on
it: same weights, same first batch).

Reading. With unnormalised inputs the first layer's gradient elements are
∝ input value (up to 255) and the activations downstream are huge, so the
histograms are far wider than their range: a large fraction is clipped into the
edge bins (drawn red) and the 2-d histogram smears the first layer's gradients
over the whole gradient axis. The normalised run's histograms are a narrow peak.
The loss curves show what the bug does to training: the raw inputs scale the
first layer's effective learning rate by ~255², so a learning rate that suits the
normalised data kills the raw run while a smaller one makes the raw run look *better*
— the loss alone does not reveal the bug, the histograms do at step 0.

Writes ``OUT/data_scaling_bug.png`` and ``OUT/data_scaling_bug.json``.
"""

import os

import numpy as np
import torch
from torch import nn

from cockpit_lite import Cockpit, extend, quantities, schedules
from experiments import common

NAME = "data_scaling_bug"
CONDITIONS = {"normalised": "standard", "raw 0..255": "raw255"}
COLORS = {"normalised": "#1f77b4", "raw 0..255": "#d62728"}
HIST2D_RANGE = ((-2, 2), (-0.25, 0.25))  # (gradient element, parameter value)
LINESTYLES = ["-", "--", ":", "-."]


def train(condition, lr, args):
    data = common.load_digits_tensors(seed=args.seed, scaling=CONDITIONS[condition])
    (x_train, y_train), test = data
    torch.manual_seed(args.seed)
    model = extend(common.mlp(args.widths))
    lossfunc = extend(nn.CrossEntropyLoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    hist_schedule = schedules.linear(args.hist_every)
    cp = Cockpit(model.named_parameters(), quantities=[
        quantities.GradHist1d(track_schedule=hist_schedule, per_layer=True),
        quantities.GradHist2d(track_schedule=hist_schedule, per_layer=True, range=HIST2D_RANGE),
        quantities.GradNorm(track_schedule=hist_schedule),
        quantities.GradVariance(track_schedule=hist_schedule),
        quantities.Loss(),
    ])
    batches = torch.Generator().manual_seed(args.seed + 1)
    curve = {"step": [], "loss": [], "epoch_step": [], "train_loss": [], "test_accuracy": []}
    step, stopped = 0, None
    for epoch in range(args.epochs):
        for index in common.minibatches(len(y_train), args.batch_size, batches):
            if args.max_steps is not None and step >= args.max_steps:
                break
            optimizer.zero_grad()
            loss = lossfunc(model(x_train[index]), y_train[index])
            with cp(step, info={"loss": loss, "optimizer": optimizer}):
                loss.backward()
            curve["step"].append(step)
            curve["loss"].append(loss.item())
            if not np.isfinite(curve["loss"][-1]):
                stopped = step
                break
            optimizer.step()
            step += 1
        train_loss, _ = common.evaluate(model, data[0])
        _, test_acc = common.evaluate(model, test)
        curve["epoch_step"].append(step)
        curve["train_loss"].append(train_loss)
        curve["test_accuracy"].append(test_acc)
        if stopped is not None:
            break
    cp.close()
    names = [n for n, _ in model.named_parameters()]
    shapes = [tuple(p.shape) for p in model.parameters()]
    return {"record": cp.get_output(), "names": names, "shapes": shapes, "curve": curve, "stopped": stopped,
            "input_range": [float(x_train.min()), float(x_train.max())]}


def stats_at(run, step, batch_size):
    """Histogram and gradient-scale numbers of one tracked step."""
    entry = run["record"][step]
    names, shapes = run["names"], run["shapes"]
    norms, variances = entry["GradNorm"], entry["GradVariance"]
    layers = []
    for i, (name, shape) in enumerate(zip(names, shapes)):
        numel = int(np.prod(shape))
        _, clipped_1d, std_1d = common.histogram_stats(entry["layers"]["GradHist1d"][i])
        h2 = entry["layers"]["GradHist2d"][i]
        n2 = float(np.asarray(h2["hist"]).sum())
        layers.append({
            "name": name, "shape": list(shape),
            "rms_gradient_element": common.rms_individual_gradient(norms[i], variances[i], numel, batch_size),
            "grad_norm": norms[i],
            "clipped_fraction_1d": clipped_1d,
            "clipped_fraction_2d": (h2.get("clipped", 0) / n2) if n2 else float("nan"),
            "binned_std_1d": std_1d,
        })
    _, clipped, std = common.histogram_stats(entry["GradHist1d"])
    h2 = entry["GradHist2d"]
    n2 = float(np.asarray(h2["hist"]).sum())
    numels = [int(np.prod(s)) for s in shapes]
    rms = float(np.sqrt(sum(layer["rms_gradient_element"] ** 2 * n for layer, n in zip(layers, numels)) / sum(numels)))
    whole = {"rms_gradient_element": rms, "grad_norm": float(np.sqrt(sum(v**2 for v in norms))),
             "clipped_fraction_1d": clipped, "clipped_fraction_2d": h2.get("clipped", 0) / n2 if n2 else float("nan"),
             "binned_std_1d": std, "loss": entry.get("Loss")}
    return {"step": step, "whole_network": whole, "layers": layers}


def param_label(name):
    """``"1.weight"`` → ``"L1 W"`` (Sequential index → Linear layer number)."""
    index, kind = name.split(".")
    return f"L{(int(index) + 1) // 2} {'W' if kind == 'weight' else 'b'}"


def plot(runs, summaries, args, path):
    from instruments import draw_gauge

    conds = list(runs)
    first_lr = args.lrs[0]
    fig = common.new_figure(19.5, 9.8)
    grid = fig.add_gridspec(2, 4, width_ratios=[1, 1, 1.15, 1.25])
    for r, cond in enumerate(conds):
        run, s = runs[cond][first_lr], summaries[cond]["step0"]
        record = run["record"]
        w, first = s["whole_network"], s["layers"][0]
        lo, hi = run["input_range"]
        ax = fig.add_subplot(grid[r, 0])
        draw_gauge("histogram_1d", record, ax, step=0)
        ax.set_title(f"{cond} inputs [{lo:.3g}, {hi:.3g}]: whole network @ step 0\n"
                     f"{w['clipped_fraction_1d']:.1%} clipped (outside ±2) · rms {w['rms_gradient_element']:.2g}",
                     fontsize=9.5, color=COLORS[cond], fontweight="bold")
        ax = fig.add_subplot(grid[r, 1])
        draw_gauge("histogram_1d", record, ax, step=0, layer=0)
        ax.set_title(f"{cond}: first layer weight {first['shape'][0]}×{first['shape'][1]}\n"
                     f"{first['clipped_fraction_1d']:.1%} clipped · rms {first['rms_gradient_element']:.2g} · "
                     f"‖g‖ {first['grad_norm']:.3g}", fontsize=9.5, color=COLORS[cond])
        ax = fig.add_subplot(grid[r, 2])
        draw_gauge("histogram_2d", record, ax, step=0, layer=0, zoom=False)
        ax.set_title(f"{cond}: first layer, gradient × parameter (2-d)\n"
                     f"{first['clipped_fraction_2d']:.1%} of the pairs clipped into the edge bins",
                     fontsize=9.5, color=COLORS[cond])

    ax_loss = fig.add_subplot(grid[0, 3])
    ax_rms = fig.add_subplot(grid[1, 3])
    for cond in conds:
        for lr, ls in zip(args.lrs, LINESTYLES * 4):
            curve = runs[cond][lr]["curve"]
            y = np.asarray(curve["loss"], dtype=float)
            steps = np.asarray(curve["step"])
            ok = np.isfinite(y)
            window = max(1, min(20, int(ok.sum())))
            if ok.sum() == 0:
                continue
            ax_loss.plot(steps[ok][window - 1:], np.convolve(y[ok], np.ones(window) / window, mode="valid"),
                         color=COLORS[cond], lw=2, ls=ls,
                         label=f"{cond}, lr {lr:g}: train loss {curve['train_loss'][-1]:.2g}, "
                               f"test acc {curve['test_accuracy'][-1]:.0%}")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("mini-batch loss (20-step mean)")
    ax_loss.legend(fontsize=8, loc="upper right")
    ax_loss.set_title(f"loss curves (SGD, batch {args.batch_size}): the better run flips\n"
                      "with the learning rate; the loss does not show the bug", fontsize=10)

    x = np.arange(len(summaries[conds[0]]["step0"]["layers"]))
    width = 0.38
    for k, cond in enumerate(conds):
        rms = [layer["rms_gradient_element"] for layer in summaries[cond]["step0"]["layers"]]
        ax_rms.bar(x + (k - 0.5) * width, rms, width, color=COLORS[cond], label=cond)
    ax_rms.axhline(2, color="k", ls=":", lw=0.8, label="GradHist1d range edge (2)")
    ax_rms.set_yscale("log")
    ax_rms.set_xticks(x, [param_label(n) for n in runs[conds[0]][first_lr]["names"]])
    ax_rms.set_ylabel("rms individual-gradient element @ step 0")
    ratio = (summaries[conds[1]]["step0"]["layers"][0]["rms_gradient_element"]
             / summaries[conds[0]]["step0"]["layers"][0]["rms_gradient_element"])
    ax_rms.set_title(f"gradient scale per parameter tensor @ step 0\nfirst-layer weights: {ratio:.0f}× larger "
                     "with raw inputs", fontsize=10)
    ax_rms.legend(fontsize=8.5, loc="upper left")
    fig.suptitle(
        f"Unnormalised inputs show up in the gradient histograms (MLP 64-{'-'.join(map(str, args.widths))}-10 on "
        "digits, identical initial weights; GradHist1d over ±2 (its default), GradHist2d over gradient ±2 × "
        "parameter ±0.25; cf. Cockpit paper Fig. 3)", fontsize=11)
    return common.save_figure(fig, path)


def main(argv=None):
    p = common.parser(NAME, __doc__)
    p.add_argument("--widths", type=int, nargs="+", default=[64, 64])
    p.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.1], help="SGD learning rates (both inputs)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hist-every", type=int, default=50, help="track the histograms every N steps")
    p.add_argument("--max-steps", type=int, default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.epochs, args.max_steps = 1, 5
    common.single_thread()
    runs, summaries = {}, {}
    for cond in CONDITIONS:
        runs[cond] = {lr: train(cond, lr, args) for lr in args.lrs}
        run = runs[cond][args.lrs[0]]
        tracked = sorted(s for s in run["record"] if "GradHist1d" in run["record"][s])
        over_training = []
        for step in tracked:
            st = stats_at(run, step, args.batch_size)
            over_training.append({"step": step, **st["whole_network"],
                                  "first_layer_clipped_fraction_1d": st["layers"][0]["clipped_fraction_1d"],
                                  "first_layer_rms_gradient_element": st["layers"][0]["rms_gradient_element"]})
        summaries[cond] = {
            "input_range": run["input_range"],
            "step0": stats_at(run, 0, args.batch_size),
            f"histograms_over_training_lr_{args.lrs[0]:g}": over_training,
            "by_lr": {
                f"{lr:g}": {
                    "final_train_loss": r["curve"]["train_loss"][-1],
                    "test_accuracy": r["curve"]["test_accuracy"][-1],
                    "epoch_train_loss": r["curve"]["train_loss"],
                    "epoch_test_accuracy": r["curve"]["test_accuracy"],
                    "stopped_at_nonfinite_loss": r["stopped"],
                }
                for lr, r in runs[cond].items()
            },
        }
        s0 = summaries[cond]["step0"]
        print(f"{cond:11s} step 0: whole {s0['whole_network']['clipped_fraction_1d']:.1%} clipped, rms "
              f"{s0['whole_network']['rms_gradient_element']:.3g}; first layer "
              f"{s0['layers'][0]['clipped_fraction_1d']:.1%} clipped, rms "
              f"{s0['layers'][0]['rms_gradient_element']:.3g} | "
              + "; ".join(f"lr {lr}: train loss {v['final_train_loss']:.3g}, test acc {v['test_accuracy']:.1%}"
                          for lr, v in summaries[cond]["by_lr"].items()))
    norm, raw = (summaries[c] for c in CONDITIONS)
    r0, n0 = raw["step0"], norm["step0"]
    conclusion = (
        f"At step 0 the raw-input run has {r0['whole_network']['clipped_fraction_1d']:.1%} of all "
        f"individual-gradient elements outside GradHist1d's default range ±2 (normalised: "
        f"{n0['whole_network']['clipped_fraction_1d']:.1%}); first layer "
        f"{r0['layers'][0]['clipped_fraction_1d']:.1%} vs {n0['layers'][0]['clipped_fraction_1d']:.1%} clipped, "
        f"rms gradient element {r0['layers'][0]['rms_gradient_element']:.3g} vs "
        f"{n0['layers'][0]['rms_gradient_element']:.3g} "
        f"({r0['layers'][0]['rms_gradient_element'] / n0['layers'][0]['rms_gradient_element']:.0f}×). "
        "Training with the same SGD learning rate: "
        + "; ".join(
            f"lr {lr}: test accuracy {raw['by_lr'][lr]['test_accuracy']:.0%} (raw) vs "
            f"{norm['by_lr'][lr]['test_accuracy']:.0%} (normalised), train loss "
            f"{raw['by_lr'][lr]['final_train_loss']:.3g} vs {norm['by_lr'][lr]['final_train_loss']:.3g}"
            for lr in norm["by_lr"])
        + ". The raw inputs act like a much larger learning rate for the first layer, so which run looks better "
        "in the loss depends on the learning rate; the histograms show the bug at step 0 regardless."
    )
    print(conclusion)
    os.makedirs(args.out, exist_ok=True)
    png = plot(runs, summaries, args, os.path.join(args.out, f"{NAME}.png"))
    summary = {
        "experiment": NAME,
        "config": {"widths": args.widths, "lrs": args.lrs, "epochs": args.epochs, "batch_size": args.batch_size,
                   "hist_every": args.hist_every, "seed": args.seed, "tiny": args.tiny,
                   "GradHist1d_range": [-2, 2], "GradHist2d_range": HIST2D_RANGE},
        "conditions": summaries,
        "conclusion": conclusion,
        "figure": png,
    }
    return common.report(args.out, NAME, summary)


if __name__ == "__main__":
    main()
