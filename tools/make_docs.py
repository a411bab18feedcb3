"""Regenerate the figures and numbers the README and ``docs/`` show.

    python -m tools.make_docs            # train, draw, write docs/numbers.json, render tables
    python -m tools.make_docs --tables   # only re-render the tables from docs/numbers.json

The full run trains the demo, the broken network the README shows (Adam at 0.3 on a
CNN) and the learning-rate comparison at their default sizes (a few minutes on one
core), copies their figures to ``docs/`` and writes the
numbers they came from to ``docs/numbers.json`` (keys ``demo_last_epoch`` and
``lr_comparison``). The benchmark numbers (key ``measured``) come from the commands
named in each entry (``python -m benchmarks.bench_overhead`` and friends: hours on a
shared machine); they are kept as they are when the file is rewritten.

Tables: every number table in the docs sits between ``<!-- table: NAME -->`` and
``<!-- /table -->``; ``render_tables`` writes each from ``docs/numbers.json``
(``TABLES`` says which entry), and ``tests/test_docs.py`` checks that the text
between the markers is exactly what it renders, so that a number in a table cannot
drift from the file.
"""

import argparse
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
NUMBERS = os.path.join(DOCS, "numbers.json")


def load_numbers(path=NUMBERS):
    """``docs/numbers.json`` as a dict."""
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def markdown_table(header, rows):
    """A GitHub markdown table (one line per row, no trailing newline)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _measured(name):
    def table(numbers):
        entry = numbers["measured"][name]
        return markdown_table(entry["header"], entry["rows"])

    return table


def _lr_table(numbers):
    """One row per learning rate of the comparison: median α, test accuracy, note."""
    lr = numbers["lr_comparison"]
    rows = []
    for key, values in lr["per_lr"].items():
        alpha = f"{values['median_alpha']:+.2f}".replace("-", "−")
        accuracy = f"{100 * values['mean_test_accuracy']:.1f}"
        notes = []
        if float(key) == float(lr["best_lr"]):
            notes.append("best")
        if values["n_dead"]:
            notes.append(f"ReLUs die in the first steps ({values['n_dead']} of {values['n_runs']})")
        if values["n_diverged"]:
            notes.append(f"{values['n_diverged']} of {values['n_runs']} diverged")
        cells = [key, alpha, accuracy, "; ".join(notes)]
        if "best" in notes:
            cells = [f"**{c}**" if c else c for c in cells[:3]] + [cells[3]]
        rows.append(cells)
    return markdown_table(["η", "median α", "test accuracy (%)", "note"], rows)


def _demo_summary(numbers):
    """The demo's last-epoch summary lines, as a list."""
    return "\n".join("- " + line for line in numbers["demo_last_epoch"])


#: table name -> function(numbers) -> markdown table (or list).
TABLES = {
    "overhead": _measured("overhead"),
    "diagnosis_cost": _measured("diagnosis_cost"),
    "diagnosis_signals": _measured("diagnosis_signals"),
    "diagnosis_period": _measured("diagnosis_period"),
    "recipe_under_load": _measured("recipe_under_load"),
    "budget": _measured("budget"),
    "memory": _measured("memory"),
    "histogram": _measured("histogram"),
    "correctness": _measured("correctness"),
    "porting_speed": _measured("recipe"),
    "subsample_overhead": _measured("subsample_overhead"),
    "subsample_honesty": _measured("subsample_honesty"),
    "interval_floor": _measured("interval_floor"),
    "hutchinson_honesty": _measured("hutchinson_honesty"),
    "subsample_scale": _measured("subsample_scale"),
    "subsample_floor": _measured("subsample_floor"),
    "memory_peak": _measured("memory_peak"),
    "per_sample_peers": _measured("per_sample_peers"),
    "memory_flatness": _measured("memory_flatness"),
    "curvature_setups": _measured("curvature_setups"),
    "fsdp_equality": _measured("fsdp_equality"),
    "fsdp_memory": _measured("fsdp_memory"),
    "diagnosis_seeds": _measured("diagnosis_seeds"),
    "diagnosis_margins": _measured("diagnosis_margins"),
    "precedence": _measured("precedence"),
    "sharpness_cost": _measured("sharpness_cost"),
    "preflight_spread": _measured("preflight_spread"),
    "fsdp_curvature": _measured("fsdp_curvature"),
    "mutation": _measured("mutation"),
    "mutation_fresh": _measured("mutation_fresh"),
    "mutation_seed2": _measured("mutation_seed2"),
    "mutation_seed3": _measured("mutation_seed3"),
    "mutation_full_curvature": _measured("mutation_full_curvature"),
    "mutation_full_engine_rules": _measured("mutation_full_engine_rules"),
    "mutation_full_formulas": _measured("mutation_full_formulas"),
    "mutation_full_subsample_histogram_log": _measured("mutation_full_subsample_histogram_log"),
    "mutation_full_diagnosis_rules": _measured("mutation_full_diagnosis_rules"),
    "mutation_alpha_hess_checks": _measured("mutation_alpha_hess_checks"),
    "mutation_checks": _measured("mutation_checks"),
    "mutation_quantities_rest": _measured("mutation_quantities_rest"),
    "mutation_quantities_rewritten": _measured("mutation_quantities_rewritten"),
    "mutation_checks_third": _measured("mutation_checks_third"),
    "mutation_checks_fourth": _measured("mutation_checks_fourth"),
    "mutation_multiprocess_by_hand": _measured("mutation_multiprocess_by_hand"),
    "mutation_left_multiprocess": _measured("mutation_left_multiprocess"),
    "lr_comparison": _lr_table,
    "demo_last_epoch": _demo_summary,
}

_BLOCK = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- /table -->)", re.S)


def tables_in(text):
    """``[(name, text between the markers)]`` of every table block in ``text``."""
    return [(m.group(2), m.group(3).rstrip("\n")) for m in _BLOCK.finditer(text)]


def render_text(text, numbers):
    """``text`` with every table block re-rendered from ``numbers``."""
    return _BLOCK.sub(lambda m: m.group(1) + TABLES[m.group(2)](numbers) + "\n" + m.group(4), text)


def doc_files():
    """README.md and every markdown page under docs/."""
    files = [os.path.join(ROOT, "README.md")]
    files += sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))
    return files


def render_tables(numbers=None):
    """Re-render every table block of README.md and docs/*.md; returns the files changed."""
    numbers = numbers or load_numbers()
    changed = []
    for path in doc_files():
        with open(path, encoding="utf-8") as file:
            text = file.read()
        new = render_text(text, numbers)
        if new != text:
            with open(path, "w", encoding="utf-8") as file:
                file.write(new)
            changed.append(path)
    return changed


def small_copy(source, name):
    """Copy a PNG into ``docs/`` with a 256-colour palette (a third of the size)."""
    from PIL import Image

    with Image.open(source) as image:
        image.convert("RGB").quantize(256).save(os.path.join(DOCS, name), optimize=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", action="store_true", help="only re-render the tables from docs/numbers.json")
    args = parser.parse_args(argv)
    if not args.tables:
        from cockpit_lite import demo
        from experiments import broken_networks, common, lr_comparison

        work = os.path.join("runs", "docs")
        cp, paths = demo.train(out=os.path.join(work, "demo"), progress=False)
        small_copy(paths["dashboards"][-1], "demo_dashboard.png")
        broken_networks.main(["--only", "lr_too_high_adam_cnn", "--out", os.path.join(work, "broken")])
        small_copy(os.path.join(work, "broken", "lr_too_high_adam_cnn.png"), "diagnosis_dashboard.png")
        lr = lr_comparison.main(["--out", os.path.join(work, "lr_comparison")])
        small_copy(os.path.join(work, "lr_comparison", "lr_comparison.png"), "lr_comparison.png")
        numbers = load_numbers() if os.path.exists(NUMBERS) else {}
        numbers["demo_last_epoch"] = demo.summary(cp.get_output())
        numbers["lr_comparison"] = {k: lr[k] for k in ("config", "per_lr", "best_lr", "conclusion")}
        common.write_json(NUMBERS, numbers)
        print(f"wrote {DOCS}/demo_dashboard.png, diagnosis_dashboard.png, lr_comparison.png, numbers.json")
    for path in render_tables():
        print(f"re-rendered the tables of {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
