"""Demo: watch a small network learn handwritten digits through cockpit-lite.

    python -m cockpit_lite.demo [--epochs 5] [--lr 0.2] [--level full] [--model cnn] [--out runs/demo] [--seed 0]

It ships with the package (``pip install ".[demo]"`` adds scikit-learn and tqdm) and
takes about a minute on a 2-core CPU with the defaults.

Trains a small CNN (or MLP) on scikit-learn's ``load_digits`` (1,797 real 8×8
handwritten digits that ship inside the scikit-learn wheel: nothing is
downloaded) with SGD, tracks every quantity of the chosen level (plus CABS and
the early-stopping criterion, which are defined for plain SGD), and writes

- ``OUT/run.jsonl``: the JSON-lines log (one line per step, flushed as it goes),
- ``OUT/dashboard__epoch_NNN.png``: one dashboard per epoch, drawn in the background,
- ``OUT/run.json``: the whole record in Cockpit's layout,

then prints where they are and a short reading of the last epoch.
"""

import argparse
import contextlib
import os
import statistics
import time

import torch
from torch import nn

from cockpit_lite import Cockpit, configuration, diagnosis, extend, log, schedules
from cockpit_lite.quantities import CABS, EarlyStopping

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover - tqdm is a demo dependency
    tqdm = None


def load_digits_tensors(seed=0, test_fraction=0.2):
    """scikit-learn's digits as ``([N, 1, 8, 8] float32 in [0, 1], labels)`` train and test splits.

    Args:
        seed: seed of the train/test split.
        test_fraction: fraction of the 1,797 images held out.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(
            "the demo's data are scikit-learn's digits. Fix: pip install scikit-learn "
            '(in a clone of cockpit-lite: pip install ".[demo]")'
        ) from error
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixels are 0..16
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    return (images[train], labels[train]), (images[test], labels[test])


def minibatches(n, batch_size, generator):
    """Index tensors of one epoch's shuffled minibatches (the last partial batch is dropped)."""
    order = torch.randperm(n, generator=generator)
    for start in range(0, n - batch_size + 1, batch_size):
        yield order[start : start + batch_size]


@torch.no_grad()
def evaluate(model, data):
    """``(mean cross-entropy, accuracy)`` of ``model`` on ``data`` without BackPACK bookkeeping."""
    from backpack import disable

    images, labels = data
    with disable():
        outputs = model(images)
        loss = nn.functional.cross_entropy(outputs, labels).item()
    accuracy = (outputs.argmax(1) == labels).float().mean().item()
    return loss, accuracy


def build_model(name):
    """The demo's small CNN (``"cnn"``) or a one-hidden-layer MLP (``"mlp"``) for 8×8 digits."""
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
        )
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    raise ValueError(f"unknown model {name!r}; choose cnn or mlp")


def train(epochs=5, lr=0.2, level="full", model_name="cnn", out="runs/demo", seed=0,
          batch_size=32, track_every=1, plots=True, progress=True):
    """Train with a Cockpit; return ``(cockpit, paths)``."""
    torch.manual_seed(seed)
    train_data, test_data = load_digits_tensors(seed)
    model, lossfunc = extend(build_model(model_name)), extend(nn.CrossEntropyLoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    os.makedirs(out, exist_ok=True)
    logpath = os.path.join(out, "run.jsonl")
    schedule = schedules.linear(track_every)
    cp = Cockpit(  # the model itself: the engine's layer rules, and BackPACK's exact curvature
        model,
        configuration(level, track_schedule=schedule, extras=True) + [CABS(schedule), EarlyStopping(schedule)],
        log=logpath,
    )
    plotter = None
    if plots:
        from instruments import EpochPlotter

        plotter = EpochPlotter(savedir=out, savename="dashboard")
    images, labels = train_data
    steps_per_epoch = len(labels) // batch_size
    shuffle = torch.Generator().manual_seed(seed)
    bar = tqdm(total=epochs * steps_per_epoch, unit="step", mininterval=0.5, disable=not progress) if tqdm else None
    step = 0
    with contextlib.ExitStack() as stack:
        if bar is not None:  # the findings the diagnosis logs are printed above the bar, not through it
            from tqdm.contrib.logging import logging_redirect_tqdm

            stack.enter_context(logging_redirect_tqdm([diagnosis.LOGGER]))
        for epoch in range(epochs):
            for index in minibatches(len(labels), batch_size, shuffle):
                optimizer.zero_grad()
                loss = lossfunc(model(images[index]), labels[index])
                with cp(step, info={"loss": loss, "optimizer": optimizer}):
                    loss.backward()
                optimizer.step()
                if bar is not None:
                    bar.update()
                    bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}")
                step += 1
            train_loss, train_acc = evaluate(model, train_data)
            test_loss, test_acc = evaluate(model, test_data)
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


def summary(record):
    """A few plain-language readings of the last epoch (medians over its steps)."""
    ends = sorted(s for s in record if "test_accuracy" in record[s])
    first = ends[-2] + 1 if len(ends) > 1 else min(record)
    window = [record[s] for s in record if first <= s <= ends[-1]]

    def median(name, reduce=lambda v: v):
        values = [reduce(e[name]) for e in window if name in e]
        values = [v for v in values if log.is_finite_number(v)]
        return statistics.median(values) if values else float("nan")

    final = record[ends[-1]]
    return [
        f"train loss {final['train_loss']:.3f}, test accuracy {final['test_accuracy']:.1%}",
        f"median α {median('Alpha'):+.2f} (0: steps land in the valley's minimum; >1: overshooting)",
        f"median norm test {median('NormTest'):.2f} (>1: gradient noise dominates, a larger batch would help)",
        f"median mean GSNR {median('MeanGSNR'):.3g} (≪1: gradient noise ≫ signal)",
        f"median λ_max {median('HessMaxEV'):.3g} (SGD is stable for λ_max < 2/η), "
        f"Hessian trace {median('HessTrace', sum):.3g}",
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--level", default="full", choices=["economy", "business", "full"])
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--track-every", type=int, default=1, help="track every N-th step")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if (args.epochs, args.level, args.model, args.batch_size, args.track_every) == (5, "full", "cnn", 32, 1):
        print("training 5 epochs at the full level: about a minute on a 2-core CPU")
    start = time.time()
    cp, paths = train(
        args.epochs, args.lr, args.level, args.model, args.out, args.seed,
        args.batch_size, args.track_every, plots=not args.no_plots,
    )
    print(f"\ntrained {args.epochs} epoch{'' if args.epochs == 1 else 's'} in {time.time() - start:.0f} s")
    print(f"log:        {paths['log']}\nrecord:     {paths['json']}")
    for path in paths.get("dashboards", []):
        print(f"dashboard:  {path}")
    print("last epoch:")
    for line in summary(cp.get_output()):
        print("  " + line)


if __name__ == "__main__":
    main()
