"""Pre-flight checks on the digits demo model, and on a deliberately broken variant.

    python -m experiments.preflight [--out runs/preflight] [--seed 0]

Runs ``cockpit_lite.checks.run`` on the demo's CNN with the demo's data
(``cockpit_lite.demo``: digits scaled to [0, 1]) and on the same set-up with three
one-line bugs planted (a softmax after the last layer, in front of
``CrossEntropyLoss``; pixels on 0..255; 20 training images copied into the test
split), and prints both reports. Then, for the healthy model, an LR range test
(``OUT/lr_range.csv`` and the figure ``OUT/lr_range.png``) and a suggested
gradient-clipping value. Takes a few seconds on one thread (``--tiny``: a 30-step
sweep).
"""

import os

import torch
from torch import nn

from cockpit_lite import checks
from experiments import common
from cockpit_lite.demo import build_model

BATCH = 64


def setup(seed=0, broken=False):
    """``(model, loss, batch, options)`` of the demo, or of its broken variant."""
    torch.manual_seed(seed)
    train, test = common.load_digits_tensors(seed, scaling="raw255" if broken else "unit")
    model = build_model("cnn")
    if broken:
        model.append(nn.Softmax(dim=1))  # bug 1: probabilities fed to CrossEntropyLoss
        test = (torch.cat([train[0][:20], test[0][20:]]), test[1])  # bug 3: test images from train
    data = {"x_train": train[0], "y_train": train[1], "x_test": test[0], "y_test": test[1]}
    options = {"task": "classification", "num_classes": 10, "data": data}
    return model, nn.CrossEntropyLoss(), (train[0][:BATCH], train[1][:BATCH]), options


def lr_range(model, loss_fn, data, out, seed, steps=100):
    """LR range test on the training split (batches of 64), CSV and figure in ``out``."""
    from instruments.gauges import lr_range as lr_gauge

    images, labels = data["x_train"], data["y_train"]
    generator = torch.Generator().manual_seed(seed)
    batches = [(images[i], labels[i]) for i in common.minibatches(len(labels), BATCH, generator)]
    result = checks.lr_range_test(model, loss_fn, batches, start=1e-4, end=10.0, steps=steps, seed=seed)
    os.makedirs(out, exist_ok=True)
    csv_path = result.to_csv(os.path.join(out, "lr_range.csv"))
    fig = common.new_figure(5.5, 3.6)
    lr_gauge.gauge(csv_path, fig.add_subplot())
    png_path = common.save_figure(fig, os.path.join(out, "lr_range.png"))
    clip = checks.suggest_clip_value(model, loss_fn, batches, seed=seed)
    return result, clip, csv_path, png_path


def main(argv=None):
    parser = common.parser("preflight", __doc__)
    args = parser.parse_args(argv)
    common.single_thread()
    reports = {}
    for name, broken in (("demo CNN", False), ("broken variant", True)):
        model, loss_fn, batch, options = setup(args.seed, broken)
        reports[name] = checks.run(model, loss_fn, batch, **options, seed=args.seed)
        print(f"== {name}" + (": softmax before CrossEntropyLoss, pixels on 0..255, 20 test images from train"
                              if broken else ": the cockpit_lite.demo model and data"))
        print(reports[name], end="\n\n")
    model, loss_fn, _, options = setup(args.seed)
    result, clip, csv_path, png_path = lr_range(model, loss_fn, options["data"], args.out, args.seed,
                                                   steps=30 if args.tiny else 100)
    print(f"== tools on the demo CNN\n{result}\n{clip}\ncurve: {csv_path}\nfigure: {png_path}")
    return reports, result


if __name__ == "__main__":
    main()
