"""Demo: watch a small network learn handwritten digits through cockpit-lite.

    python -m experiments.demo [--epochs 4] [--lr 0.05] [--level full] [--model cnn] [--out runs/demo] [--seed 0]

Trains a small CNN (or MLP) on scikit-learn's ``load_digits`` (1,797 real 8×8
handwritten digits that ship inside the scikit-learn wheel: nothing is
downloaded) with SGD, tracks every quantity of the chosen level, and writes

- ``OUT/run.jsonl``: the JSON-lines log (one line per step, flushed as it goes),
- ``OUT/dashboard__epoch_NNN.png``: one dashboard per epoch, drawn in the background,
- ``OUT/run.json``: the whole record in Cockpit's layout,

then prints where they are and a short reading of the last epoch.
"""

import argparse
import os
import statistics
import time
import warnings

import numpy as np
import torch
from torch import nn

from cockpit_lite import Cockpit, configuration, extend, log, schedules

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover - tqdm is a demo dependency
    tqdm = None


def load_data(seed, test_fraction=0.2):
    """Digits as float tensors in [0, 1] (``[N, 1, 8, 8]``) and labels, split into train and test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * (1 - test_fraction))
    return (images[order[:cut]], labels[order[:cut]]), (images[order[cut:]], labels[order[cut:]])


def build_model(name):
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
        )
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    raise ValueError(f"unknown model {name!r}; choose cnn or mlp")


@torch.no_grad()
def evaluate(model, lossfunc, data):
    """Mean loss and accuracy on ``data`` (no BackPACK bookkeeping)."""
    images, labels = data
    from backpack import disable

    with disable():
        outputs = model(images)
        loss = nn.functional.cross_entropy(outputs, labels).item()
    return loss, (outputs.argmax(1) == labels).float().mean().item()


def train(epochs=4, lr=0.05, level="full", model_name="cnn", out="runs/demo", seed=0,
          batch_size=32, track_every=1, plots=True, progress=True, quiet=False):
    """Train with a Cockpit; return ``(cockpit, paths)``."""
    torch.manual_seed(seed)
    train_data, test_data = load_data(seed)
    model, lossfunc = extend(build_model(model_name)), extend(nn.CrossEntropyLoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    os.makedirs(out, exist_ok=True)
    logpath = os.path.join(out, "run.jsonl")
    cp = Cockpit(
        model.named_parameters(),
        configuration(level, track_schedule=schedules.linear(track_every)),
        log=logpath,
    )
    plotter = None
    if plots:
        from instruments import EpochPlotter

        plotter = EpochPlotter(savedir=out, savename="dashboard")
    images, labels = train_data
    steps_per_epoch = len(labels) // batch_size
    bar = tqdm(total=epochs * steps_per_epoch, unit="step", disable=not progress) if tqdm else None
    step = 0
    for epoch in range(epochs):
        order = torch.randperm(len(labels))
        for batch in range(steps_per_epoch):
            index = order[batch * batch_size : (batch + 1) * batch_size]
            optimizer.zero_grad()
            loss = lossfunc(model(images[index]), labels[index])
            with cp(step, info={"loss": loss, "optimizer": optimizer}):
                loss.backward(create_graph=cp.create_graph(step))
            optimizer.step()
            if bar is not None:
                bar.update()
                bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}")
            step += 1
        train_loss, train_acc = evaluate(model, lossfunc, train_data)
        test_loss, test_acc = evaluate(model, lossfunc, test_data)
        cp.log(step - 1, epoch, train_loss, None, test_loss, train_acc, None, test_acc, lr)
        if plotter is not None:
            plotter.plot(cp, savename_append=f"__epoch_{epoch:03d}")
    if bar is not None:
        bar.close()
    if plotter is not None:
        plotter.close()
    cp.close()
    paths = {"log": logpath, "json": cp.write(os.path.join(out, "run"))}
    if plotter is not None:
        paths["dashboards"] = sorted(
            os.path.join(out, f) for f in os.listdir(out) if f.startswith("dashboard__epoch_")
        )
    return cp, paths


def summary(record, steps_per_epoch):
    """A few plain-language readings of the last epoch."""
    last = max(record)
    window = [s for s in record if s > last - steps_per_epoch]

    def median(name):
        values = [record[s][name] for s in window if log.is_finite_number(record[s].get(name))]
        return statistics.median(values) if values else float("nan")

    epoch_steps = [s for s in record if "test_accuracy" in record[s]]
    final = record[max(epoch_steps)] if epoch_steps else {}
    lines = [
        f"train loss {final.get('train_loss', float('nan')):.3f}, test accuracy "
        f"{final.get('test_accuracy', float('nan')):.1%}",
        f"median α {median('Alpha'):+.2f} (0: steps land in the valley's minimum; >1: overshooting)",
        f"median norm test {median('NormTest'):.2f} (>1: gradient noise dominates, a larger batch would help)",
        f"median mean GSNR {median('MeanGSNR'):.3g}",
        f"median λ_max {median('HessMaxEV'):.3g}, Hessian trace "
        f"{statistics.median([sum(record[s]['HessTrace']) for s in window if 'HessTrace' in record[s]] or [float('nan')]):.3g}",
    ]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--level", default="full", choices=["economy", "business", "full"])
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--track-every", type=int, default=1, help="track every N-th step")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    start = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cp, paths = train(
            args.epochs, args.lr, args.level, args.model, args.out, args.seed,
            args.batch_size, args.track_every, plots=not args.no_plots,
        )
    print(f"\ntrained {args.epochs} epochs in {time.time() - start:.0f} s")
    print(f"log:        {paths['log']}\nrecord:     {paths['json']}")
    for path in paths.get("dashboards", []):
        print(f"dashboard:  {path}")
    steps_per_epoch = int(np.ceil(max(cp.get_output()) / max(args.epochs, 1)))
    print("last epoch:")
    for line in summary(cp.get_output(), steps_per_epoch):
        print("  " + line)


if __name__ == "__main__":
    main()
