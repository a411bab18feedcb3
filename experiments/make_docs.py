"""Regenerate the figures the README shows: ``python -m experiments.make_docs``.

Runs the demo and the learning-rate comparison at their default sizes (about
2-3 minutes on one core) and copies their figures to ``docs/`` with the numbers
they came from (``docs/numbers.json``).
"""

import os

from experiments import common, demo, lr_comparison

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def small_copy(source, name):
    """Copy a PNG into ``docs/`` with a 256-colour palette (a third of the size)."""
    from PIL import Image

    with Image.open(source) as image:
        image.convert("RGB").quantize(256).save(os.path.join(DOCS, name), optimize=True)


def main(argv=None):
    work = os.path.join("runs", "docs")
    cp, paths = demo.train(out=os.path.join(work, "demo"), progress=False)
    small_copy(paths["dashboards"][-1], "demo_dashboard.png")
    lr = lr_comparison.main(["--out", os.path.join(work, "lr_comparison")])
    small_copy(os.path.join(work, "lr_comparison", "lr_comparison.png"), "lr_comparison.png")
    numbers = {
        "demo_last_epoch": demo.summary(cp.get_output()),
        "lr_comparison": {k: lr[k] for k in ("config", "per_lr", "best_lr", "conclusion")},
    }
    common.write_json(os.path.join(DOCS, "numbers.json"), numbers)
    print(f"wrote {DOCS}/demo_dashboard.png, lr_comparison.png, numbers.json")


if __name__ == "__main__":
    main()
