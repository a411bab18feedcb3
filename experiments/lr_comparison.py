"""Learning-rate grid with α: the analogue of the Cockpit paper's Figure 5.

    python -m experiments.lr_comparison [--lrs 0.001 0.003 ... 10] [--seeds 3] [--epochs 20]
                                        [--level alpha|economy] [--out runs/lr_comparison] [--tiny]

Trains the same MLP (64-64-10, ReLU) on scikit-learn's digits with plain SGD (no
momentum, constant learning rate, batch 32, a fixed number of epochs) for every
learning rate × seed, tracking ``Alpha`` (plus the cheap ``Loss``, ``GradNorm``,
``Distance``, ``UpdateSize``; ``--level economy`` tracks the whole economy level) at
every step. α is the normalised position of each step on the local 1-d parabola
along the update: −1 = did not move, 0 = landed in the valley's minimum, +1 = landed
at the same height on the far side, >1 = overshot.

Per run it records all α values, the median α over all steps and over the last
``--last-fraction`` of them, the final training loss and the test accuracy. A run
*diverges* when its mini-batch loss becomes non-finite (cockpit-lite then records
NaN and flags the step ``nonfinite_loss``) or exceeds ``--explode-factor`` × its
first loss; it is stopped cleanly there and marked ``diverged``. (Cross-entropy on
ReLU nets rarely produces NaN: too-large learning rates kill the ReLUs or blow the
loss up to 1e3..1e8 instead, which the second rule catches; ``--lrs ... 1e38`` shows
the NaN path.)

Writes ``OUT/lr_comparison.png`` (α distributions per learning rate, test accuracy
against median α coloured by learning rate, loss curves, accuracy and α against the
learning rate) and ``OUT/lr_comparison.json`` (per-run numbers and a conclusion).
The paper's claim being checked: the best-performing runs have a median α slightly
above 0 (they overshoot the local minimum a little).
"""

import math
import os
import time

import numpy as np
import torch
from torch import nn

from cockpit_lite import Cockpit, configuration, extend, quantities
from experiments import common

NAME = "lr_comparison"
DEFAULT_LRS = [1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
DEAD_WINDOW = 10  # steps at the end over which a 'dead' network's hidden gradients are all zero
WIDTHS = (64,)
ALPHA_CLIP = (-1.5, 3.5)  # display range of the α violins


def make_quantities(level):
    """The tracked quantities: α and cheap companions, or the whole economy level."""
    if level == "economy":
        return configuration("economy")
    return [quantities.Alpha(), quantities.Loss(), quantities.GradNorm(), quantities.Distance(),
            quantities.UpdateSize()]


def train_run(lr, seed, data, args):
    """Train one run; return its result dict (numbers only, JSON-ready apart from NaN)."""
    (x_train, y_train), test = data
    torch.manual_seed(seed)
    model = extend(common.mlp(WIDTHS))
    lossfunc = extend(nn.CrossEntropyLoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    cp = Cockpit(model.named_parameters(), quantities=make_quantities(args.level))
    batches = torch.Generator().manual_seed(1000 + seed)
    losses, epochs_done, diverged, reason = [], 0, False, None
    first_loss = None
    step = 0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for index in common.minibatches(len(y_train), args.batch_size, batches):
            if args.max_steps is not None and step >= args.max_steps:
                break
            optimizer.zero_grad()
            loss = lossfunc(model(x_train[index]), y_train[index])
            with cp(step, info={"loss": loss, "optimizer": optimizer}):
                loss.backward()
            value = loss.item()
            losses.append(value)
            first_loss = value if first_loss is None else first_loss
            if not math.isfinite(value):
                diverged, reason = True, "non-finite loss"
                break
            if value > args.explode_factor * first_loss:
                diverged, reason = True, f"loss {value:.3g} > {args.explode_factor:g} x first loss"
                break
            optimizer.step()
            step += 1
        if diverged:
            break
        epochs_done = epoch + 1
        train_loss, train_acc = common.evaluate(model, data[0])
        test_loss, test_acc = common.evaluate(model, test)
        cp.log(step - 1, epoch, train_loss, None, test_loss, train_acc, None, test_acc, lr)
    seconds = time.perf_counter() - start
    cp.close()
    record = cp.get_output()

    train_loss, train_acc = common.evaluate(model, data[0])
    test_loss, test_acc = common.evaluate(model, test)
    alpha_steps = sorted(s for s in record if "Alpha" in record[s])
    alphas = [record[s]["Alpha"] for s in alpha_steps]
    finite = common.finite(alphas)
    n_last = max(1, int(math.ceil(len(finite) * args.last_fraction))) if finite.size else 0
    flags = {}
    for s in record:
        for flag in record[s].get("flags", []):
            kind = flag.split(":")[0]
            flags[kind] = flags.get(kind, 0) + 1
    nonfinite_steps = [s for s in record if "nonfinite_loss" in record[s].get("flags", [])]
    # dead ReLUs: every hidden-layer gradient exactly zero over the last steps (only the output layer learns)
    norms = [record[s]["GradNorm"] for s in sorted(record) if isinstance(record[s].get("GradNorm"), list)]
    tail = norms[-DEAD_WINDOW:]
    dead = bool(tail) and not diverged and all(all(v == 0.0 for v in n[:-2]) for n in tail)
    n_first = max(1, int(math.ceil(len(finite) * 0.05))) if finite.size else 0
    return {
        "lr": lr,
        "seed": seed,
        "steps": len(losses),
        "epochs_completed": epochs_done,
        "diverged": diverged,
        "divergence": reason,
        "diverged_at_step": len(losses) - 1 if diverged else None,
        "recorded_nonfinite_loss_steps": nonfinite_steps,
        "flags": flags,
        "median_alpha": float(np.median(finite)) if finite.size else float("nan"),
        "median_alpha_last": float(np.median(finite[-n_last:])) if finite.size else float("nan"),
        "median_alpha_first5pct": float(np.median(finite[:n_first])) if finite.size else float("nan"),
        "dead_hidden_layers": dead,
        "mean_alpha": float(np.mean(finite)) if finite.size else float("nan"),
        "fraction_alpha_finite": float(finite.size / len(alphas)) if alphas else 0.0,
        "final_train_loss": train_loss,
        "final_train_accuracy": train_acc,
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "final_minibatch_loss": losses[-1] if losses else float("nan"),
        "seconds": seconds,
        "alphas": [common.rounded(a) for a in alphas],
        "alpha_steps": f"{alpha_steps[0]}..{alpha_steps[-1]}" if alpha_steps else "",
        "losses": losses,  # mini-batch losses (for the figure; not written to JSON)
    }


def by_lr(runs):
    """``{lr: [runs]}`` in increasing learning rate."""
    out = {}
    for r in runs:
        out.setdefault(r["lr"], []).append(r)
    return dict(sorted(out.items()))


def conclude(runs, last_fraction):
    """A short, data-driven reading of the grid (a string) and the numbers behind it."""
    groups = by_lr(runs)
    stats = {}
    for lr, rs in groups.items():
        ok = [r for r in rs if not r["diverged"]]
        stats[lr] = {
            "mean_test_accuracy": float(np.mean([r["test_accuracy"] for r in rs])),
            "median_alpha": common.median([r["median_alpha"] for r in rs]),
            "n_runs": len(rs),
            "n_diverged": len(rs) - len(ok),
            "n_dead": sum(r["dead_hidden_layers"] for r in rs),
            "median_alpha_first5pct": common.median([r["median_alpha_first5pct"] for r in rs]),
        }
    complete = {lr: s for lr, s in stats.items() if s["n_diverged"] == 0 and s["n_dead"] < s["n_runs"]}
    if not complete:
        return "every learning rate diverged: no conclusion", stats, None
    best_lr = max(complete, key=lambda lr: complete[lr]["mean_test_accuracy"])
    best = stats[best_lr]
    best_alphas = [r["median_alpha"] for r in groups[best_lr]]
    overall_best = max((r for r in runs if not r["diverged"]), key=lambda r: r["test_accuracy"])
    a = best["median_alpha"]
    if 0 < a <= 1:
        verdict = ("slightly above 0 (steps overshoot the local minimum a little), as the paper found"
                   if a <= 0.6 else "above 0 but closer to 1 than the paper's 'slightly above 0'")
    elif a > 1:
        verdict = "above 1, unlike the paper (which found best runs slightly above 0)"
    else:
        verdict = "below 0, unlike the paper (which found best runs slightly above 0)"
    parts = [
        f"Best learning rate {best_lr:g} (mean test accuracy {best['mean_test_accuracy']:.1%} over "
        f"{best['n_runs']} seed(s)) has median α {a:+.2f} "
        f"(per seed {', '.join(f'{x:+.2f}' for x in best_alphas)}): {verdict}. "
        f"Single best run: lr {overall_best['lr']:g}, seed {overall_best['seed']}, median α "
        f"{overall_best['median_alpha']:+.2f}, test accuracy {overall_best['test_accuracy']:.1%}."
    ]
    small = [lr for lr in complete if lr < best_lr and stats[lr]["median_alpha"] < 0]
    if small:
        parts.append(
            f"Smaller learning rates ({', '.join(f'{lr:g}' for lr in small)}) have median α < 0 "
            f"({', '.join(format(stats[lr]['median_alpha'], '+.2f') for lr in small)}): the steps stop short "
            "of the valley floor and training is slow."
        )
    large = [lr for lr in stats if lr > best_lr]
    if large:
        desc = []
        for lr in large:
            s = stats[lr]
            d = f"{lr:g}: median α {s['median_alpha']:+.2f}" if math.isfinite(s["median_alpha"]) else f"{lr:g}: no α"
            if s["n_diverged"]:
                d += f", {s['n_diverged']}/{s['n_runs']} diverged"
            if s["n_dead"]:
                d += (f", {s['n_dead']}/{s['n_runs']} with dead ReLUs (median α of the first 5% of steps "
                      f"{s['median_alpha_first5pct']:+.2f})")
            d += f", acc {s['mean_test_accuracy']:.0%}"
            desc.append(d)
        parts.append("Larger learning rates: " + "; ".join(desc) + ".")
        if any(stats[lr]["n_dead"] for lr in large):
            parts.append("Caveat: once the hidden ReLUs die (all hidden gradients 0, only the output layer "
                         "learns) the later α values describe that easy convex problem, so the run's median α "
                         "understates how far the first steps overshot.")
    finite_pairs = [(math.log10(lr), s["median_alpha"]) for lr, s in stats.items()
                    if math.isfinite(s["median_alpha"])]
    if len(finite_pairs) >= 3:
        x, y = np.array(finite_pairs).T
        rank = np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1]
        parts.append(f"Median α rises with the learning rate (Spearman ρ = {rank:+.2f} over learning rates).")
    return " ".join(parts), stats, best_lr


def lr_colors(lrs):
    """A colour per learning rate (log scale) and the ``ScalarMappable`` for a colour bar."""
    from matplotlib import cm, colormaps
    from matplotlib.colors import ListedColormap, LogNorm

    lo, hi = min(lrs), max(lrs)
    norm = LogNorm(vmin=lo, vmax=hi if hi > lo else lo * 10)
    cmap = ListedColormap(colormaps["plasma"](np.linspace(0.0, 0.85, 256)), name="plasma_dark")  # no pale yellow
    return {lr: cmap(norm(lr)) for lr in lrs}, cm.ScalarMappable(norm=norm, cmap=cmap)


def smooth(values, window):
    """Trailing moving average (NaN-free input)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or window <= 1:
        return v
    window = min(window, len(v))
    c = np.cumsum(np.insert(v, 0, 0.0))
    out = np.empty_like(v)
    out[window - 1:] = (c[window:] - c[:-window]) / window
    out[: window - 1] = c[1:window] / np.arange(1, window)
    return out


def plot(runs, stats, best_lr, conclusion, args, path):
    """Draw the 2×2 figure and save it to ``path``."""
    import textwrap

    groups = by_lr(runs)
    lrs = list(groups)
    colors, mappable = lr_colors(lrs)
    fig = common.new_figure(15, 10.5)
    axes = fig.subplots(2, 2)
    (ax_violin, ax_scatter), (ax_loss, ax_lr) = axes
    positions = np.log10(lrs)
    step = np.min(np.diff(positions)) if len(positions) > 1 else 1.0

    # (a) α distribution per learning rate (all seeds pooled)
    lo, hi = ALPHA_CLIP
    ax_violin.axhspan(0, 1, color="#2ca02c", alpha=0.06, zorder=0)
    ax_violin.axhline(0, color="k", lw=0.8)
    ax_violin.axhline(1, color="gray", lw=0.6, ls=":")
    for pos, lr in zip(positions, lrs):
        values = np.concatenate([common.finite(r["alphas"]) for r in groups[lr]])
        if values.size == 0:
            ax_violin.text(pos, 0, "no finite α", rotation=90, ha="center", va="center", fontsize=8)
            continue
        shown = np.clip(values, lo, hi)
        if np.ptp(shown) > 0:
            parts = ax_violin.violinplot([shown], positions=[pos], widths=0.8 * step, showextrema=False)
            for body in parts["bodies"]:
                body.set_facecolor(colors[lr])
                body.set_edgecolor("k")
                body.set_linewidth(0.5)
                body.set_alpha(0.75)
        q1, med, q3 = np.percentile(values, [25, 50, 75])
        ax_violin.vlines(pos, max(q1, lo), min(q3, hi), color="k", lw=3)
        ax_violin.plot(pos, np.clip(med, lo, hi), "o", color="white", mec="k", ms=6, zorder=5)
        above, below = (values > hi).mean(), (values < lo).mean()
        if above > 0.005:
            ax_violin.text(pos, hi + 0.05, f"{above:.0%}▲", ha="center", va="bottom", fontsize=8)
        if below > 0.005:
            ax_violin.text(pos, lo - 0.05, f"{below:.0%}▼", ha="center", va="top", fontsize=8)
        n_div = sum(r["diverged"] for r in groups[lr])
        n_dead = sum(r["dead_hidden_layers"] for r in groups[lr])
        notes = ([f"{n_div}/{len(groups[lr])}\ndiverged"] if n_div else []) + \
                ([f"{n_dead}/{len(groups[lr])}\ndead"] if n_dead else [])
        if notes:
            ax_violin.text(pos, lo + 0.1, "\n".join(notes), ha="center", va="bottom", fontsize=7.5,
                           color="#d62728")
    ax_violin.set_xticks(positions, [f"{lr:g}" for lr in lrs], rotation=45 if len(lrs) > 9 else 0)
    ax_violin.set_ylim(lo - 0.35, hi + 0.35)
    ax_violin.set_xlabel("learning rate (SGD, constant)")
    ax_violin.set_ylabel("α per step (clipped to the panel)")
    ax_violin.set_title("α distribution per learning rate (all steps, all seeds; ● median, bar IQR)\n"
                        "α<0: step stops short of the valley floor · α=0: lands in it · α>1: overshoots",
                        fontsize=10)

    # (b) test accuracy vs median α (paper's Figure 5)
    medians = common.finite([r["median_alpha"] for r in runs])
    xlo = max(-1.1, min(-0.5, medians.min() - 0.15)) if medians.size else -1.1
    xhi = min(2.5, max(0.8, medians.max() + 0.15)) if medians.size else 2.5
    ax_scatter.axvspan(0, 0.6, color="#2ca02c", alpha=0.08, zorder=0, label="0 < α ≤ 0.6 ('slightly above 0')")
    ax_scatter.axvline(0, color="k", lw=0.8)
    for r in runs:
        a = r["median_alpha"]
        if not math.isfinite(a):
            continue
        clipped = a > xhi
        marker = ">" if clipped else ("X" if r["diverged"] else ("v" if r["dead_hidden_layers"] else "o"))
        ax_scatter.scatter(min(a, xhi), r["test_accuracy"], color=colors[r["lr"]], s=70, marker=marker,
                           edgecolor="k", linewidth=0.6, zorder=4)
    if best_lr is not None:
        best_alpha = stats[best_lr]["median_alpha"]
        ax_scatter.axvline(best_alpha, color=colors[best_lr], lw=1.5, ls="--",
                           label=f"best lr {best_lr:g}: median α {best_alpha:+.2f}")
    if any(r["diverged"] for r in runs):
        ax_scatter.scatter([], [], marker="X", color="gray", edgecolor="k", label="diverged (stopped)")
    if any(r["dead_hidden_layers"] for r in runs):
        ax_scatter.scatter([], [], marker="v", color="gray", edgecolor="k", label="dead ReLUs (hidden gradients 0)")
    if any(math.isfinite(r["median_alpha"]) and r["median_alpha"] > xhi for r in runs):
        ax_scatter.scatter([], [], marker=">", color="gray", edgecolor="k", label=f"median α > {xhi:g} (at the edge)")
    ax_scatter.set_xlim(xlo, xhi + 0.05)
    ax_scatter.set_ylim(0, 1.02)
    ax_scatter.set_xlabel("median α of the run")
    ax_scatter.set_ylabel("final test accuracy")
    ax_scatter.legend(loc="lower left", fontsize=8.5, framealpha=0.9)
    bar = fig.colorbar(mappable, ax=ax_scatter, pad=0.01)
    bar.set_label("learning rate")
    ax_scatter.set_title("test accuracy vs median α (one point per run; cf. Cockpit paper Fig. 5)", fontsize=10)

    # (c) loss curves
    window = max(1, int(args.smooth))
    for lr in lrs:
        for i, r in enumerate(groups[lr]):
            y = np.asarray(r["losses"], dtype=float)
            ok = np.isfinite(y)
            if not ok.any():
                continue
            y_plot = smooth(np.where(ok, y, np.nan)[ok], window)
            ax_loss.plot(np.flatnonzero(ok), y_plot, color=colors[lr], lw=1.2, alpha=0.85,
                         label=f"lr {lr:g}" if i == 0 else None)
            if r["diverged"]:
                last = np.flatnonzero(ok)[-1]
                ax_loss.plot(last, y_plot[-1], "X", color=colors[lr], mec="k", ms=9, zorder=5)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel(f"mini-batch loss ({window}-step moving average)")
    ax_loss.legend(fontsize=8, ncol=2, loc="lower left")
    ax_loss.set_title("training loss per run (X: run stopped, diverged)", fontsize=10)

    # (d) accuracy and median α against the learning rate
    acc_mean = [stats[lr]["mean_test_accuracy"] for lr in lrs]
    ax_lr.plot(lrs, acc_mean, "-", color="#1f77b4", lw=2, label="test accuracy (mean over seeds)")
    for lr in lrs:
        ax_lr.scatter([lr] * len(groups[lr]), [r["test_accuracy"] for r in groups[lr]], color="#1f77b4", s=14)
    ax_lr.set_xscale("log")
    ax_lr.set_ylim(0, 1.02)
    ax_lr.set_xlabel("learning rate")
    ax_lr.set_ylabel("test accuracy", color="#1f77b4")
    twin = ax_lr.twinx()
    med = np.array([stats[lr]["median_alpha"] for lr in lrs])
    twin.plot(lrs, np.clip(med, lo, hi), "s--", color="#d62728", lw=1.5, label="median α (clipped)")
    twin.axhline(0, color="#d62728", lw=0.6, ls=":")
    twin.set_ylim(lo - 0.35, hi + 0.35)
    twin.set_ylabel("median α", color="#d62728")
    for lr, a in zip(lrs, med):
        if math.isfinite(a):
            twin.annotate(f"{a:+.2f}", (lr, np.clip(a, lo, hi)), textcoords="offset points", xytext=(0, 7),
                          ha="center", fontsize=7.5, color="#d62728")
    if best_lr is not None:
        ax_lr.axvline(best_lr, color="gray", lw=0.8, ls="--")
    h1, l1 = ax_lr.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    ax_lr.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8.5)
    ax_lr.set_title("test accuracy and median α per learning rate", fontsize=10)

    n_seeds = len(groups[lrs[0]])
    fig.suptitle(
        f"SGD learning-rate grid on digits (MLP 64-{'-'.join(map(str, WIDTHS))}-10, batch {args.batch_size}, "
        f"{args.epochs} epochs, {n_seeds} seed(s)): does the best run have median α slightly above 0?\n"
        + "\n".join(textwrap.wrap(conclusion.split(". Single")[0] + ".", 170)),
        fontsize=10.5,
    )
    return common.save_figure(fig, path)


def main(argv=None):
    p = common.parser(NAME, __doc__)
    p.add_argument("--lrs", type=float, nargs="+", default=None, help="learning rates (default 1e-3 … 10)")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds per learning rate")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-steps", type=int, default=None, help="stop each run after this many steps")
    p.add_argument("--level", default="alpha", choices=["alpha", "economy"])
    p.add_argument("--last-fraction", type=float, default=0.2, help="'last X%%' window of the median α")
    p.add_argument("--explode-factor", type=float, default=10.0,
                   help="stop a run whose loss exceeds this multiple of its first loss ('inf': only NaN/Inf)")
    p.add_argument("--smooth", type=int, default=25, help="moving-average window of the loss curves")
    args = p.parse_args(argv)
    if args.tiny:
        args.lrs = args.lrs or [0.03, 0.3]
        args.seeds, args.epochs, args.max_steps = 1, 1, args.max_steps or 15
        args.smooth = 3
    lrs = sorted(args.lrs or DEFAULT_LRS)
    common.single_thread()
    data = common.load_digits_tensors(seed=args.seed, scaling="unit")
    runs = []
    start = time.perf_counter()
    for lr in lrs:
        for seed in range(args.seed, args.seed + args.seeds):
            r = train_run(lr, seed, data, args)
            runs.append(r)
            print(f"lr {lr:<8g} seed {seed}: median α {r['median_alpha']:+.3f} (last "
                  f"{args.last_fraction:.0%}: {r['median_alpha_last']:+.3f}), train loss "
                  f"{r['final_train_loss']:.3g}, test acc {r['test_accuracy']:.1%}"
                  + (f", DIVERGED at step {r['diverged_at_step']} ({r['divergence']})" if r["diverged"] else "")
                  + f" [{r['seconds']:.1f} s]", flush=True)
    conclusion, stats, best_lr = conclude(runs, args.last_fraction)
    print(conclusion)
    os.makedirs(args.out, exist_ok=True)
    png = plot(runs, stats, best_lr, conclusion, args, os.path.join(args.out, f"{NAME}.png"))
    summary = {
        "experiment": NAME,
        "config": {
            "lrs": lrs, "seeds": args.seeds, "epochs": args.epochs, "batch_size": args.batch_size,
            "model": f"MLP 64-{'-'.join(map(str, WIDTHS))}-10 ReLU", "optimizer": "SGD (no momentum)",
            "level": args.level, "last_fraction": args.last_fraction, "explode_factor": args.explode_factor,
            "max_steps": args.max_steps, "tiny": args.tiny,
        },
        "runs": [{k: v for k, v in r.items() if k != "losses"} for r in runs],
        "per_lr": {f"{lr:g}": s for lr, s in stats.items()},
        "best_lr": best_lr,
        "conclusion": conclusion,
        "seconds": time.perf_counter() - start,
        "figure": png,
    }
    return common.report(args.out, NAME, summary)


if __name__ == "__main__":
    main()
