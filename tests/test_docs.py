"""The README and docs/ as a user reads them: every python block runs as pasted, and
every number they quote is the one in ``docs/numbers.json``.

- Code: each fenced ``python`` block of README.md and docs/*.md runs in a fresh
  namespace in an empty folder. A block preceded by ``<!-- docs-test: skip (why) -->``
  is left out (keep that rare: e.g. a GPU or a second machine). Blocks that need an
  optional package are skipped when it is not installed.
- Tables: each ``<!-- table: NAME -->`` block is exactly what
  ``python -m tools.make_docs --tables`` renders from ``docs/numbers.json``.
- Quoted numbers: ``QUOTES`` lists (file, quoted text, key in numbers.json); the text
  must be in the file and contain the file's value. A timing (``ms``) or ratio (``×``)
  in README.md or docs/performance.md outside code must be a value of numbers.json.
"""

import io
import math
import json
import os
import re
from contextlib import redirect_stdout

import pytest

from cockpit_lite import diagnosis as _diagnosis
from tools import make_docs
from foreign_warnings import raised_as_errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = re.compile(r"<!-- docs-test: skip \((.+?)\) -->\s*$")
#: pages whose blocks tests/test_compat.py runs, with checks of their results (brute force,
#: the files they write): not run a second time here.
RUN_BY_TEST_COMPAT = ("docs/porting.md", "docs/integrations.md", "docs/quantities.md#custom-quantities")
#: optional package -> the extra that installs it (a block using it is skipped without it).
OPTIONAL = {"lightning": "lightning", "transformers": "hf", "tensorboard": "tensorboard"}


def _files():
    return [os.path.relpath(p, ROOT) for p in make_docs.doc_files()]


def _read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as file:
        return file.read()


def _blocks():
    """``(file, line, code, skip reason or None)`` of every python block."""
    out = []
    for name in _files():
        lines = _read(name).split("\n")
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```python":
                start = i
                i += 1
                while lines[i].strip() != "```":
                    i += 1
                before = lines[start - 1] if start else ""
                match = SKIP.search(before)
                out.append((name, start + 1, "\n".join(lines[start + 1:i]) + "\n", match and match.group(1)))
            i += 1
    return out


BLOCKS = _blocks()


def _run_by_test_compat(name, line):
    for entry in RUN_BY_TEST_COMPAT:
        page, _, section = entry.partition("#")
        if page != name:
            continue
        if not section:
            return True
        heading = "## " + section.replace("-", " ")
        lines = _read(name).split("\n")
        above = [text for text in lines[:line] if text.startswith("## ")]
        if above and above[-1].lower() == heading.lower():
            return True
    return False


def test_there_are_blocks_and_few_are_skipped():
    assert len(BLOCKS) >= 10
    assert sum(skip is not None for *_, skip in BLOCKS) <= 2, [b[:2] for b in BLOCKS if b[3]]


@pytest.mark.parametrize("name, line, code, skip", BLOCKS, ids=[f"{b[0]}:{b[1]}" for b in BLOCKS])
def test_block_runs_as_pasted(name, line, code, skip, tmp_path, monkeypatch):
    if skip:
        pytest.skip(skip)
    if _run_by_test_compat(name, line):
        pytest.skip("run by tests/test_compat.py, which checks its results")
    for package, extra in OPTIONAL.items():
        if re.search(rf"^\s*(import|from) {package}\b", code, flags=re.M):
            pytest.importorskip(package, reason=f"the {extra} extra is not installed")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    with redirect_stdout(io.StringIO()), raised_as_errors():
        exec(compile(code, f"{name}:{line}", "exec"), namespace)
    if name == "README.md" and "cp.report()" in code:
        _check_the_report_shown(namespace["cp"])


def _check_the_report_shown(cp):
    """The README shows the first example's report: the same findings, in the same order."""
    text = _read("README.md")
    shown = text[text.index("```text\ncockpit-lite diagnosis"):]
    shown = shown[:shown.index("```", 8)]
    heads = re.findall(r"^- \[(\w+)\] (\w+)(?: in '([^']+)')?, step (\d+)$", shown, flags=re.M)
    found = [(f.severity, f.kind, f.layer or "", str(f.step)) for f in cp.findings]
    assert heads == found, "the README's sample report no longer matches what its first example finds"
    assert f"diagnosis: {len(found)} finding(s)" in shown
    steps = sorted(cp.get_output())
    assert f'"steps {steps[0]}–19 ({len(steps)} logged)"' in text  # the dashboard's title, explained
    shown = shown[len("```text\n"):].rstrip()
    printed = _diagnosis.format_report(cp.findings, cp.output, cp.names)
    _assert_same_report(printed[:len(shown)], shown)


_NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def _assert_same_report(printed, shown):
    """The same words, and the same numbers within the rounding a thread count can move."""
    assert re.sub(_NUMBER, "#", printed) == re.sub(_NUMBER, "#", shown), (printed, shown)
    assert [float(n) for n in re.findall(_NUMBER, printed)] == pytest.approx(
        [float(n) for n in re.findall(_NUMBER, shown)], rel=2e-2, abs=1e-6)


# ----------------------------------------------------------------------------- numbers


def _numbers():
    return make_docs.load_numbers()


def test_every_table_is_rendered_from_numbers_json():
    numbers = _numbers()
    used = set()
    for name in _files():
        for table, body in make_docs.tables_in(_read(name)):
            used.add(table)
            expected = make_docs.TABLES[table](numbers)
            assert body == expected, f"{name}: table {table!r} differs from docs/numbers.json; " \
                                     "run python -m tools.make_docs --tables"
    assert used == set(make_docs.TABLES), set(make_docs.TABLES) - used


def _get(numbers, key):
    value = numbers
    for part in key.split("/"):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return str(value)


O = "measured/overhead/rows"
E = "measured/mutation_full_engine_rules/parts"
#: (file, quoted text, key in numbers.json: "/"-separated, list indices as numbers).
QUOTES = [
    ("README.md", "economy costs 73.7× the plain step on an MLP", "measured/recipe/rows/0/3"),
    ("README.md", "given the same parameters: 19.2×)", "measured/recipe/rows/0/2"),
    ("docs/performance.md", "Plain steps: MLP 0.46 ms", "measured/overhead/plain_step_ms/MLP"),
    ("docs/performance.md", "CNN 8.82 ms", "measured/overhead/plain_step_ms/CNN"),
    ("docs/performance.md", "transformer 20.1 ms", "measured/overhead/plain_step_ms/transformer"),
    ("docs/performance.md", "ResNet 93.4 ms", "measured/overhead/plain_step_ms/ResNet"),
    ("docs/performance.md", "MLP's 0.46 ms step", "measured/overhead/plain_step_ms/MLP"),
    ("docs/performance.md", "when its plain MLP step took 0.6 ms instead of 0.45",
     "measured/diagnosis_period/rows/0/1|measured/diagnosis_cost/rows/0/1"),
    ("docs/performance.md", "these add 0.5–0.6×", "measured/diagnosis_period/where/period_added_mlp"),
    ("docs/performance.md", "for 1.05×\n(0.3 ms)", "measured/diagnosis_period/where/budget_for_1_05_mlp"),
    ("docs/curvature.md", "business with it is 11.58× the plain step", "measured/ggn_cost/business (GGN)/transformer"),
    ("docs/curvature.md", "4.2× economy's, and 6.67× on the CNN, 2.7×",
     "measured/ggn_cost/business (GGN), ratio to economy/transformer|measured/ggn_cost/business (GGN)/cnn"
     "|measured/ggn_cost/business (GGN), ratio to economy/cnn"),
    ("docs/performance.md", "`GradHist1d` alone is 15.5×", "measured/overhead/per_quantity/GradHist1d_mlp"),
    ("docs/performance.md", "1.88× on the CNN", "measured/overhead/per_quantity/GradHist1d_cnn"),
    ("docs/performance.md", "3.22× on the\n  transformer", "measured/overhead/per_quantity/GradHist1d_transformer"),
    ("docs/performance.md", "(NormTest alone): 3.6×", "measured/overhead/per_quantity/NormTest_mlp"),
    ("docs/performance.md", "1.55× on the CNN", "measured/overhead/per_quantity/NormTest_cnn"),
    ("docs/performance.md", "2.33× on the transformer", "measured/overhead/per_quantity/NormTest_transformer"),
    ("docs/performance.md", "economy's 33× is that floor", "measured/overhead/per_quantity/resnet_economy_floor"),
    ("docs/performance.md", "(about 15–25 µs)", "measured/overhead/per_quantity/cockpit_step_bookkeeping_us"),
    ("docs/performance.md", "nothing due 1.03×", "measured/ddp/untracked"),
    ("docs/performance.md", "`Cockpit(model)` 1.65× (1.65–1.83×", "measured/ddp/default|measured/ddp/default_range"),
    ("docs/performance.md", "every step 8.80×", "measured/ddp/economy"),
    ("docs/performance.md", "DDP step (3.34 ms)", "measured/ddp/plain_step_ms"),
    ("docs/porting.md", "parameters / Cockpit is 0.27, 0.30 and\n0.52 on the MLP",
     "measured/recipe/busy/mlp/economy|measured/recipe/busy/mlp/business|measured/recipe/busy/mlp/full"),
    ("docs/porting.md", "0.78, 0.90 and 0.37 on the CNN",
     "measured/recipe/busy/cnn/economy|measured/recipe/busy/cnn/business|measured/recipe/busy/cnn/full"),
    ("docs/performance.md", "took 5–33 products", "measured/hess_max_ev_products/min|measured/hess_max_ev_products/max"),
    ("docs/performance.md", "(median 8)", "measured/hess_max_ev_products/median"),
    ("docs/curvature.md", "needs 5–33 Hessian-vector products",
     "measured/hess_max_ev_products/min|measured/hess_max_ev_products/max"),
    ("docs/curvature.md", "(median 8)", "measured/hess_max_ev_products/median"),
    ("docs/experiments.md", "ends at 96.9% test accuracy", "demo_last_epoch/0"),
    ("docs/experiments.md", "(Spearman ρ = +0.93)", "lr_comparison/conclusion"),
    ("docs/experiments.md", "× 3 seeds", "lr_comparison/config/seeds"),
    ("docs/experiments.md", ", 20 epochs", "lr_comparison/config/epochs"),
    ("docs/experiments.md", "up to +0.57", "lr_comparison/conclusion"),
    ("docs/experiments.md", "final losses 5.34", "measured/experiments/noisy_quadratic/final_loss_large"),
    ("docs/experiments.md", "vs 5.31", "measured/experiments/noisy_quadratic/final_loss_small"),
    ("docs/experiments.md", "α medians +1.00", "measured/experiments/noisy_quadratic/alpha_large"),
    ("docs/experiments.md", "vs −0.99", "measured/experiments/noisy_quadratic/alpha_small"),
    ("docs/experiments.md", "update sizes 590× apart", "measured/experiments/noisy_quadratic/update_ratio"),
    ("docs/experiments.md", "are 79× and", "measured/experiments/vanishing_gradients/layer1_smaller"),
    ("docs/experiments.md", "and 11× smaller", "measured/experiments/vanishing_gradients/layer2_smaller"),
    ("docs/experiments.md", "(100% and 99% of their elements", "measured/experiments/vanishing_gradients/centre_bin"),
    ("docs/experiments.md", "at 8% test accuracy", "measured/experiments/vanishing_gradients/sigmoid_accuracy"),
    ("docs/experiments.md", "net reaches 80%", "measured/experiments/vanishing_gradients/relu_accuracy"),
    ("docs/experiments.md", "15.1%\nof all", "measured/experiments/data_scaling_bug/outside_unnormalised"),
    ("docs/experiments.md", "(0.0%\nnormalised)", "measured/experiments/data_scaling_bug/outside_normalised"),
    ("docs/experiments.md", "158× larger", "measured/experiments/data_scaling_bug/first_layer_larger"),
    ("docs/development.md", "164 mutants, 34 of them also",
     "measured/mutation_seed2/totals/sampled|measured/mutation_seed2/totals/in_earlier_samples"),
    ("docs/development.md", "140 of the 164 were killed. Its 24 survivors were 18 missing tests",
     "measured/mutation_seed2/totals/killed_before|measured/mutation_seed2/totals/sampled"
     "|measured/mutation_seed2/totals/survivors|measured/mutation_seed2/totals/missing_tests"),
    ("docs/development.md", "and 6 equivalent mutants", "measured/mutation_seed2/totals/equivalent"),
    ("docs/development.md", "164 mutants, 38 of them also",
     "measured/mutation_seed3/totals/sampled|measured/mutation_seed3/totals/in_earlier_samples"),
    ("docs/development.md", "152 of the 164 were killed. Its 12 survivors were 10 missing tests",
     "measured/mutation_seed3/totals/killed_before|measured/mutation_seed3/totals/sampled"
     "|measured/mutation_seed3/totals/survivors|measured/mutation_seed3/totals/missing_tests"),
    ("docs/development.md", "and 2 equivalent mutants", "measured/mutation_seed3/totals/equivalent"),
    ("docs/development.md", "398\nmutants, 8 of them message wording, so 390 scored",
     "measured/mutation_full_curvature/totals/mutants|measured/mutation_full_curvature/totals/wording"
     "|measured/mutation_full_curvature/totals/scored"),
    ("docs/development.md", "355 of the 390\nwere killed. Its 35 survivors were 24 missing tests",
     "measured/mutation_full_curvature/totals/killed_before|measured/mutation_full_curvature/totals/scored"
     "|measured/mutation_full_curvature/totals/survivors|measured/mutation_full_curvature/totals/missing_tests"),
    ("docs/development.md", "and 11 equivalent mutants", "measured/mutation_full_curvature/totals/equivalent"),
    ("docs/development.md", "379\nmutants, 19 of them message wording, so 360 scored",
     "measured/mutation_full_formulas/totals/mutants|measured/mutation_full_formulas/totals/wording"
     "|measured/mutation_full_formulas/totals/scored"),
    ("docs/development.md", "350 of the\n360 were killed. Its 10 survivors were 9 missing tests and 1 left",
     "measured/mutation_full_formulas/totals/killed_before|measured/mutation_full_formulas/totals/scored"
     "|measured/mutation_full_formulas/totals/survivors|measured/mutation_full_formulas/totals/missing_tests"
     "|measured/mutation_full_formulas/totals/left"),
    ("docs/development.md", "2,266 mutants, 68 of them message wording, so 2,198\nscored",
     "measured/mutation_full_subsample_histogram_log/totals/mutants|measured/mutation_full_subsample_histogram_log/totals/wording|measured/mutation_full_subsample_histogram_log/totals/scored"),
    ("docs/development.md", "1,995 were killed before", "measured/mutation_full_subsample_histogram_log/totals/killed_before"),
    ("docs/development.md", "Its 203 survivors were 77\nmissing tests, 90 equivalent mutants and 36 that only a GPU reaches",
     "measured/mutation_full_subsample_histogram_log/totals/survivors|measured/mutation_full_subsample_histogram_log/totals/missing_tests|measured/mutation_full_subsample_histogram_log/totals/equivalent|measured/mutation_full_subsample_histogram_log/totals/left"),
    ("docs/development.md", "2,193 mutants, 66 of them message\nwording, so 2,127 scored", "measured/mutation_full_diagnosis_rules/totals/mutants|measured/mutation_full_diagnosis_rules/totals/wording|measured/mutation_full_diagnosis_rules/totals/scored"),
    ("docs/development.md", "1,646 of the 2,127 were killed.\nTheir 481 survivors were 438 missing tests and 43 equivalent",
     "measured/mutation_full_diagnosis_rules/totals/killed_before|measured/mutation_full_diagnosis_rules/totals/scored|measured/mutation_full_diagnosis_rules/totals/survivors|measured/mutation_full_diagnosis_rules/totals/missing_tests|measured/mutation_full_diagnosis_rules/totals/equivalent"),
    ("docs/development.md", "The first part ran 990 of the 1,404 mutants of 27d9f66",
     f"{E}/first/run|{E}/first/mutants|{E}/first/baseline"),
    ("docs/development.md", "920 were killed, and its 70 survivors were 11 missing tests, 52 equivalent\nmutants and 7 that",
     f"{E}/first/killed_before|{E}/first/survivors|{E}/first/missing_tests|{E}/first/equivalent|{E}/first/left"),
    ("docs/development.md", "593 mutants (the 414 not reached,", f"{E}/second/run|{E}/second/not_reached"),
    ("docs/development.md", "`GenericRule.per_sample` again, 163 mutants for\nits 157",
     f"{E}/second/per_sample|{E}/first/replaced"),
    ("docs/development.md", "the tests of 27d9f66 for 833 mutants and those of\n1996784 for the other 593",
     f"{E}/first/baseline|{E}/first/kept|{E}/second/baseline|{E}/second/run"),
    ("docs/development.md", "Of the 593, 540 were\nkilled; its 53 survivors were 12 missing tests, 37 equivalent mutants and 4",
     f"{E}/second/run|{E}/second/killed_before|{E}/second/survivors|{E}/second/missing_tests|{E}/second/equivalent"
     f"|{E}/second/left"),
    ("docs/development.md", "the 101 mutants of the four norm functions the fix changed, run again\nfrom the branch, were all "
     "killed but the 4 equivalent", f"{E}/norm_after_fix/run|{E}/norm_after_fix/equivalent"),
    ("docs/development.md", "Of the 1,144 mutants run, 983 were killed", "measured/mutation_alpha_hess_checks/totals/scored|measured/mutation_alpha_hess_checks/totals/killed_before"),
    ("docs/development.md", "the 161 survivors, 74 were missing tests", "measured/mutation_alpha_hess_checks/totals/survivors|measured/mutation_alpha_hess_checks/totals/written"),
    ("docs/development.md", "5 were killed by tests outside the group's selection", "measured/mutation_alpha_hess_checks/totals/by_hand"),
    ("docs/development.md", "Of the 1,245 mutants run, 1,011 were", "measured/mutation_checks/totals/scored|measured/mutation_checks/totals/killed_before"),
    ("docs/development.md", "Of the 234 survivors, 205 were missing tests", "measured/mutation_checks/totals/survivors|measured/mutation_checks/totals/missing_tests"),
    ("docs/development.md", "and 29 equivalent; none is left", "measured/mutation_checks/totals/equivalent"),
    ("docs/development.md", "(the table's command): 2,187 mutants, none of them message wording", "measured/mutation_quantities_rest/totals/mutants"),
    ("docs/development.md", "1,860 were killed. Of the 327 survivors", "measured/mutation_quantities_rest/totals/killed_before|measured/mutation_quantities_rest/totals/survivors"),
    ("docs/development.md", "Of the 327 survivors, 154 were missing tests", "measured/mutation_quantities_rest/totals/survivors|measured/mutation_quantities_rest/totals/missing_tests"),
    ("docs/development.md", "(129 killed by the tests written for them", "measured/mutation_quantities_rest/totals/written"),
    ("docs/development.md", "25 reached only by", "measured/mutation_quantities_rest/totals/by_hand"),
    ("docs/development.md", "110 equivalent and 63 left", "measured/mutation_quantities_rest/totals/equivalent|measured/mutation_quantities_rest/totals/left"),
    ("docs/development.md", "366 mutants, 313 killed by the tests of", "measured/mutation_quantities_rewritten/totals/scored|measured/mutation_quantities_rewritten/totals/killed_before"),
    ("docs/development.md", "Of the 53 survivors, 34 were missing tests", "measured/mutation_quantities_rewritten/totals/survivors|measured/mutation_quantities_rewritten/totals/missing_tests"),
    ("docs/development.md", "237 mutants run, 191 killed before", "measured/mutation_checks_third/totals/scored|measured/mutation_checks_third/totals/killed_before"),
    ("docs/development.md", "Of the 46 survivors, 27 were missing tests", "measured/mutation_checks_third/totals/survivors|measured/mutation_checks_third/totals/missing_tests"),
    ("docs/development.md", "In all, 1274 mutants were run, 1120", "measured/mutation_checks_fourth/totals/scored|measured/mutation_checks_fourth/totals/killed_before"),
    ("docs/development.md", "Of the 154 survivors, 110 were missing tests, 29 equivalent and 15", "measured/mutation_checks_fourth/totals/survivors|measured/mutation_checks_fourth/totals/missing_tests|measured/mutation_checks_fourth/totals/equivalent|measured/mutation_checks_fourth/totals/left"),
]


@pytest.mark.parametrize("name, quoted, key", QUOTES, ids=[f"{q[0]}:{q[2]}" for q in QUOTES])
def test_quoted_number_is_the_one_in_numbers_json(name, quoted, key):
    text = _read(name)
    assert quoted in text, f"{name} no longer says {quoted!r}: update QUOTES"
    value = " ".join(_get(_numbers(), k) for k in key.split("|"))
    numbers_in_quote = re.findall(r"[+−-]?\d+(?:\.\d+)?", quoted)
    assert numbers_in_quote and all(n in value for n in numbers_in_quote), (quoted, value)


def _prose(text):
    """``text`` without fenced code blocks, HTML comments and table blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!-- table: \w+ -->.*?<!-- /table -->", "", text, flags=re.S)
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def _flat(value):
    if isinstance(value, dict):
        return [s for v in value.values() for s in _flat(v)]
    if isinstance(value, list):
        return [s for v in value for s in _flat(v)]
    return [str(value)]


#: ratios in the prose that are settings, not measurements.
SETTINGS = {"1.25×", "2.5×"}


@pytest.mark.parametrize("name", ["README.md", "docs/performance.md", "docs/porting.md"])
def test_every_timing_and_ratio_is_in_numbers_json(name):
    values = " ".join(_flat(_numbers()))
    prose = _prose(_read(name))
    found = re.findall(r"\d+(?:\.\d+)?(?:–\d+(?:\.\d+)?)?(?: ms|×)", prose)
    unknown = sorted({f for f in found if f not in SETTINGS and f.replace(" ms", "") not in values
                      and f not in values})
    assert not unknown, f"{name} quotes {unknown}, which docs/numbers.json does not hold"


SAMPLE_COLUMNS = {"sampled": 1, "in_earlier_samples": 2, "killed_before": 3, "killed": 4, "equivalent": 5, "left": 6}
WHOLE_GROUP_COLUMNS = {"mutants": 1, "scored": 2, "killed_before": 3, "killed": 4, "equivalent": 5, "left": 6}


@pytest.mark.parametrize("table, columns", [
    ("mutation_seed2", SAMPLE_COLUMNS),
    ("mutation_seed3", SAMPLE_COLUMNS),
    ("mutation_full_curvature", WHOLE_GROUP_COLUMNS),
    ("mutation_full_engine_rules", WHOLE_GROUP_COLUMNS),
    ("mutation_full_formulas", WHOLE_GROUP_COLUMNS),
    ("mutation_full_subsample_histogram_log", WHOLE_GROUP_COLUMNS),
    ("mutation_full_diagnosis_rules", WHOLE_GROUP_COLUMNS),
    ("mutation_alpha_hess_checks", WHOLE_GROUP_COLUMNS),
    ("mutation_checks", WHOLE_GROUP_COLUMNS),
    ("mutation_quantities_rest", WHOLE_GROUP_COLUMNS),
    ("mutation_quantities_rewritten", {"scored": 1, "killed_before": 2, "killed": 3, "equivalent": 4, "left": 5}),
    ("mutation_checks_third", WHOLE_GROUP_COLUMNS),
    ("mutation_checks_fourth", WHOLE_GROUP_COLUMNS),
])
def test_the_later_mutation_runs_totals_are_their_rows(table, columns):
    """The totals the prose quotes add up from the table's rows (a whole group's mutants: the message
    wording, in parentheses, and the scored ones): every survivor is a missing test (now killed), an
    equivalent mutant or left (one only a GPU can tell)."""
    entry = _numbers()["measured"][table]
    cells = list(zip(*entry["rows"]))
    sums = {name: sum(int(cell.split()[0]) for cell in cells[i]) for name, i in columns.items()}
    totals = {"left": 0, **entry["totals"]}
    counted = [name for name in sums if name != "killed"]
    assert {name: totals[name] for name in counted} == {name: sums[name] for name in counted}
    if "wording" in totals:
        wording = sum(int(cell.split()[1].strip("()")) for cell in cells[columns["mutants"]])
        assert totals["wording"] == wording == totals["mutants"] - totals["scored"]
    scored = sums.get("sampled", sums.get("scored"))
    missing, equivalent, left = totals["missing_tests"], sums["equivalent"], sums["left"]
    assert totals["survivors"] == scored - sums["killed_before"] == missing + equivalent + left
    assert sums["killed"] == sums["killed_before"] + missing and sums["killed"] + equivalent + left == scored


def test_counts_quoted_are_the_code_s():
    from cockpit_lite.diagnosis import KINDS
    from experiments import broken_networks

    assert f"({len(KINDS)} kinds:" in _read("README.md")
    broken, healthy = len(broken_networks.BROKEN), len(broken_networks.HEALTHY)
    for name in ("README.md", "docs/diagnosis.md"):
        assert f"{broken} broken set-ups and {healthy} healthy twins" in _read(name), name
    assert len(json.loads(_read("docs/numbers.json"))["lr_comparison"]["per_lr"]) == 13


def test_links_between_pages_resolve():
    missing = []
    later = {"docs/install.md", "docs/logs.md", "docs/resume.md"}  # written alongside, by other changes
    for name in _files():
        folder = os.path.dirname(name)
        for target in re.findall(r"\]\(([^)#\s]+\.(?:md|png|json))(?:#[^)]*)?\)", _read(name)):
            if target.startswith("http"):
                continue
            path = os.path.normpath(os.path.join(folder, target))
            if not os.path.exists(os.path.join(ROOT, path)) and path not in later:
                missing.append(f"{name} -> {target}")
    assert not missing, missing


T = "cockpit_lite.diagnosis.thresholds"
#: (file, quoted text, "module:NAME", factor): the number in the text is the constant × factor.
CONSTANTS = [
    ("docs/diagnosis.md", "last 7 losses > 2 L₀", f"{T}:SPIKE", 1),
    ("docs/diagnosis.md", "one loss > 10× the first", f"{T}:SPIKE_ONE", 1),
    ("docs/diagnosis.md", "learned ≥ 30 % of L₀", f"{T}:LEARNED", 100),
    ("docs/diagnosis.md", "climbed back 60 % of the way", f"{T}:COLLAPSE", 100),
    ("docs/diagnosis.md", "‖Δθ‖/‖θ‖ ≥ 0.5 while", f"{T}:HIGH_RATIO", 1),
    ("docs/diagnosis.md", "after 10 records the loss", f"{T}:MIN_STEPS", 1),
    ("docs/diagnosis.md", "moved < 10 % of L₀", f"{T}:LOW_DROP", 100),
    ("docs/diagnosis.md", "fell to ≤ 1/30 of its peak", f"{T}:LATE_COLLAPSE", 1),
    ("docs/diagnosis.md", "then for 25 % of the steps it took", f"{T}:STALL_SHARE", 100),
    ("docs/diagnosis.md", "after updates ≥ 0.05 of", f"{T}:DIVERGE_RATIO", 1),
    ("docs/diagnosis.md", "‖Δθ‖/‖θ‖ < 3e-4", f"{T}:LOW_RATIO", 1),
    ("docs/diagnosis.md", "first layer ≥ 50× the last two", f"{T}:EXPLODE_RATIO", 1),
    ("docs/diagnosis.md", "total ‖g‖ ≥ 100× its early level", f"{T}:EXPLODE_GROWTH", 1),
    ("docs/diagnosis.md", "activations grow ≥ 3× per layer", f"{T}:ACT_GAIN", 1),
    ("docs/diagnosis.md", "the median of the last 7 losses", f"{T}:COLLAPSE_WINDOW", 1),
    ("docs/diagnosis.md", "or ≥ 0.2 with the loss above L₀", f"{T}:OVERSHOOT_RATIO", 1),
    ("docs/diagnosis.md", "≤ 1e-3 of the last two", f"{T}:VANISH_RATIO", 1),
    ("docs/diagnosis.md", "≥ 50 % of a ReLU module's units", f"{T}:DEAD", 100),
    ("docs/diagnosis.md", "≥ 50 % of tanh/sigmoid outputs", f"{T}:SATURATED", 100),
    ("docs/diagnosis.md", "std) of the first input ≥ 10", f"{T}:INPUT_SCALE", 1),
    ("docs/diagnosis.md", "held-out accuracy ≤ 2 / C", f"{T}:CHANCE_FACTOR", 1),
    ("docs/diagnosis.md", "training loss stays ≥ 0.95 L₀", f"{T}:CHANCE_LOSS", 1),
    ("docs/diagnosis.md", "‖G‖² ≥ 10 × B", f"{T}:NOISE_RATIO", 1),
    ("docs/diagnosis.md", "over 5 records the gradient noise", f"{T}:NOISE_WINDOW", 1),
    ("docs/diagnosis.md", "≥ 10 % above its lowest such level", f"{T}:OVERFIT_RISE", 100),
    ("docs/diagnosis.md", "and ≥ 2σ of its log-to-log noise", f"{T}:OVERFIT_Z", 1),
    ("docs/diagnosis.md", "(median of 3 logs)", f"{T}:OVERFIT_WINDOW", 1),
    ("docs/diagnosis.md", "fell ≥ 20 % since", f"{T}:OVERFIT_FALL", 100),
    ("docs/diagnosis.md", "is ≥ 3× below the held-out loss", f"{T}:OVERFIT_GAP", 1),
    ("docs/diagnosis.md", "each of the first 10 steps", "cockpit_lite.diagnosis:DENSE_STEPS", 1),
    ("README.md", "of the first 10 steps and then", "cockpit_lite.diagnosis:DENSE_STEPS", 1),
    ("README.md", "and then at every 10th", "cockpit_lite.diagnosis:EVERY", 1),
    ("docs/diagnosis.md", "at every 10th step", "cockpit_lite.diagnosis:EVERY", 1),
    ("docs/curvature.md", "Two untracked steps in every 50", "cockpit_lite.budget:PROBE", 1),
    ("docs/curvature.md", "once in every 100 steps", "cockpit_lite.budget:CHECK", 1),
    ("docs/curvature.md", "moves by more than 1.3×", "cockpit_lite.budget:DRIFT", 1),
    ("docs/curvature.md", "calibrates again (32 steps", "cockpit_lite.budget:STEPS", 1),
    ("docs/curvature.md", "Steps 10–41", "cockpit_lite.budget:WARMUP", 1),
    ("docs/curvature.md", "(2, 60 and 200 plain", "cockpit_lite.budget:PRIOR[0]", 1),
    ("docs/curvature.md", "(2, 60 and 200 plain", "cockpit_lite.budget:PRIOR[1]", 1),
    ("docs/curvature.md", "(2, 60 and 200 plain", "cockpit_lite.budget:PRIOR[2]", 1),
    ("docs/curvature.md", "(40 % bookkeeping", "cockpit_lite.budget:SHARES[0]", 100),
    ("docs/curvature.md", "30 % each for the other", "cockpit_lite.budget:SHARES[1]", 100),
    ("docs/curvature.md", "30 % each for the other", "cockpit_lite.budget:SHARES[2]", 100),
]


@pytest.mark.parametrize("name, quoted, where, factor", CONSTANTS, ids=[c[2] + ":" + c[1][:20] for c in CONSTANTS])
def test_quoted_setting_is_the_code_s(name, quoted, where, factor):
    import importlib

    assert quoted in _read(name), f"{name} no longer says {quoted!r}: update CONSTANTS"
    module, constant = where.split(":")
    constant, _, index = constant.partition("[")  # (an element of a tuple: NAME[i])
    value = getattr(importlib.import_module(module), constant)
    value = (value[int(index[:-1])] if index else value) * factor
    numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", quoted)]
    assert any(math.isclose(n, value, rel_tol=1e-9) for n in numbers), (quoted, value)


def test_the_diagnosis_page_shows_what_its_command_prints(tmp_path):
    """docs/diagnosis.md's sample report is what ``python -m instruments diagnose`` prints
    for ``python -m experiments.broken_networks --only lr_too_high_adam_cnn``."""
    from experiments import broken_networks
    from instruments import cli

    text = _read("docs/diagnosis.md")
    command = "$ python -m instruments diagnose runs/broken_networks/lr_too_high_adam_cnn.jsonl\n"
    shown = text[text.index(command) + len(command):]
    shown = shown[:shown.index("```")].rstrip("\n")
    with redirect_stdout(io.StringIO()):
        broken_networks.main(["--only", "lr_too_high_adam_cnn", "--out", str(tmp_path), "--no-dashboards"])
    printed = io.StringIO()
    with redirect_stdout(printed):
        cli.main(["diagnose", str(tmp_path / "lr_too_high_adam_cnn.jsonl")])
    _assert_same_report(printed.getvalue().rstrip("\n"), shown)
