"""Mutation testing of one group of modules with mutmut (not part of CI: hours on 2 cores).

    OMP_NUM_THREADS=1 .venv/bin/python -m tools.mutation GROUP [MUTANT ...] [--workdir DIR] [--sample K [--seed S]]
    .venv/bin/python -m tools.mutation GROUP --results [--survivors] [--workdir DIR] [--sample K [--seed S]]
    OMP_NUM_THREADS=1 .venv/bin/python -m tools.mutation GROUP MUTANT ... --in-process TEST [--in-process TEST]

copies the files git tracks (and untracked ones it does not ignore) into ``DIR/GROUP``
(default: ``cockpit-lite-mutation`` in the temporary directory), links the clone's ``.venv``
there, narrows the copy's ``[tool.mutmut]`` (``pyproject.toml``) to the group's modules and
the tests that mirror them (``GROUPS``), runs ``mutmut run --max-children 1`` in the copy
and prints, per module, how many mutants were killed, survived, had no test, ...
(``--results``: only that, from the copy's last run; ``--survivors``: and the survivors'
names, for ``mutmut show``). A mutant's test run is then the group's tests that reach the
mutated function, a few seconds. mutmut's working directory (``mutants/``) stays in the copy
and keeps its results: a run without ``MUTANT`` names skips the mutants it has a result
for, a run with names (or globs: survivors again after a new test) runs those; delete
``DIR/GROUP`` for a fresh start. ``OMP_NUM_THREADS=1`` is required (see the comment above
``[tool.mutmut]``).

Mutants that only change the words of a message (a string constant with a space in it:
record keys, severities and modes have none) are counted as ``wording``, not scored, as
the configuration already leaves error messages and warnings out. A whole group takes
hours (2,181 mutants of ``diagnosis_rules`` at 3-8 s each on a loaded 2-core machine):
``--sample K`` runs and counts a seeded sample of K mutants of each module (the same K
and ``--seed S``, default 0, give the same sample while the source is unchanged; another
seed draws an independent sample, which may share mutants with the first). ``--in-process TEST``
runs the mutants without a result in one interpreter against ``TEST`` alone (``run_in_process``). The
scores and the equivalent mutants are in docs/development.md.
"""

import argparse
import ast
import collections
import fnmatch
import glob
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CURVATURE = ["curvature.py", "hess_trace.py", "tic.py", "tic_diag.py", "tic_trace.py"]
QUANTITY_TESTS = ["tests/quantities/", "tests/test_subsample.py", "tests/test_resume.py", "tests/test_step.py"]

#: group -> (modules to mutate, test selection, extra pytest arguments, modules left out)
GROUPS = {
    "engine_rules": (["cockpit_lite/engine/rules/*"], ["tests/engine/"], [], []),
    "subsample_histogram_log": (
        ["cockpit_lite/subsample.py", "cockpit_lite/histogram.py", "cockpit_lite/log/*"],
        ["tests/test_subsample.py", "tests/test_histogram.py", "tests/test_histogram_properties.py",
         "tests/test_log.py", "tests/instruments/test_readers.py"], [], []),
    # the quantities' subsampled estimators are tested against their brute force in tests/test_subsample.py,
    # their saved state (``STATE``, ``load_state_dict``) by resuming runs in tests/test_resume.py, the flags of
    # the values their ``StepData`` helpers (``resolved``, ``without_noise``) make NaN in tests/test_step.py
    "quantities": (["cockpit_lite/quantities/*"], QUANTITY_TESTS, [],
                   [f"cockpit_lite/quantities/{name}" for name in CURVATURE]),
    "quantities_curvature": ([f"cockpit_lite/quantities/{name}" for name in CURVATURE], QUANTITY_TESTS, [], []),
    "checks": (["cockpit_lite/checks/*"], ["tests/checks/"], [], []),
    # one torch thread: the diagnosis tests' two-thread runs repeat the same findings
    "diagnosis_rules": (["cockpit_lite/diagnosis/rules/*"], ["tests/diagnosis/"], ["-k", "not 2threads"], []),
}


def _toml_list(values):
    return "[\n" + "".join(f'    "{value}",\n' for value in values) + "]"


def narrowed(config, group):
    """``pyproject.toml``'s text with ``[tool.mutmut]`` narrowed to ``group``."""
    modules, tests, extra, left_out = GROUPS[group]
    config = re.sub(r"only_mutate = \[.*?\n\]", "only_mutate = " + _toml_list(modules), config, flags=re.S)
    config = re.sub(r"pytest_add_cli_args_test_selection = \[.*?\n\]",
                    "pytest_add_cli_args_test_selection = " + _toml_list(tests), config, flags=re.S)
    if extra:
        config = re.sub(r"pytest_add_cli_args = \[(.*?)\]",
                        lambda m: "pytest_add_cli_args = [" + m.group(1) + "".join(f', "{a}"' for a in extra) + "]",
                        config)
    if left_out:
        config = config.replace("do_not_mutate_patterns =", "do_not_mutate = " + _toml_list(left_out)
                                + "\ndo_not_mutate_patterns =", 1)
    return config


#: appended to the copy's tests/conftest.py: mutmut runs a mutant's tests with ``-x`` in the order it
#: lists them, so a mutant that a unit test kills could first wait for a scenario's training runs
FAST_FIRST = """

def pytest_collection_modifyitems(items):
    \"\"\"The fastest tests first (durations from mutmut's stats run, in its ``mutants/``).\"\"\"
    import json
    import os

    if os.path.exists("mutmut-stats.json"):
        with open("mutmut-stats.json", encoding="utf-8") as file:
            durations = json.load(file)["duration_by_test"]
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
"""


def copy_clone(destination, group):
    """The clone's files (tracked, or untracked and not ignored) copied over ``destination``, with
    the narrowed configuration, the fastest tests first and a link to the clone's ``.venv``."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = os.path.join(ROOT, name)
        if os.path.isfile(source):
            os.makedirs(os.path.dirname(os.path.join(destination, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(destination, name))
    if not os.path.lexists(os.path.join(destination, ".venv")):
        os.symlink(os.path.join(ROOT, ".venv"), os.path.join(destination, ".venv"))
    with open(os.path.join(destination, "tests", "conftest.py"), "a", encoding="utf-8") as file:
        file.write(FAST_FIRST)
    path = os.path.join(destination, "pyproject.toml")
    with open(path, encoding="utf-8") as file:
        config = file.read()
    with open(path, "w", encoding="utf-8") as file:
        file.write(narrowed(config, group))


def _prose(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and any(c.isspace() for c in node.value)


def _wording_only(a, b):
    """Whether the trees ``a`` and ``b`` differ at most in string constants holding a space
    (message prose; a record key, a severity or a mode has none)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, ast.Constant):
        return a.value == b.value or (_prose(a) and isinstance(b.value, str))
    if isinstance(a, list):
        return len(a) == len(b) and all(_wording_only(x, y) for x, y in zip(a, b))
    if not isinstance(a, ast.AST):
        return a == b
    return all(_wording_only(getattr(a, f, None), getattr(b, f, None)) for f in a._fields
               if f not in ("name", "type_comment"))


def wording_mutants(workdir):
    """Names of the mutants in ``workdir``'s ``mutants/`` that change only a message's words."""
    names = set()
    for path in glob.glob(os.path.join(workdir, "mutants", "cockpit_lite", "**", "*.py"), recursive=True):
        module = os.path.relpath(path, os.path.join(workdir, "mutants"))[:-3].replace(os.sep, ".")
        with open(path, encoding="utf-8") as file:
            functions = [n for n in ast.walk(ast.parse(file.read())) if isinstance(n, ast.FunctionDef)]
        originals = {n.name[:-len("_mutmut_orig")]: n for n in functions if n.name.endswith("__mutmut_orig")}
        for node in functions:
            stem, _, number = node.name.rpartition("_mutmut_")
            if number.isdigit() and stem in originals and _wording_only(originals[stem], node):
                names.add(f"{module}.{node.name}")
    return names


def results(workdir, wording=(), chosen=None, survivors=False):
    """``{module: Counter(status)}`` of the last run in ``workdir`` (of the ``chosen`` mutants
    only, if given); the mutants named in ``wording`` are counted as such, whatever their
    status. ``survivors``: the names of the surviving mutants instead."""
    out = subprocess.run([os.path.join(workdir, ".venv", "bin", "mutmut"), "results", "--all", "true"],
                         cwd=workdir, capture_output=True, text=True, check=True).stdout
    table = collections.defaultdict(collections.Counter)
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name and (chosen is None or name in chosen):
            table[re.split(r"\.x_|\.xǁ", name)[0]]["wording" if name in wording else status] += 1
            if survivors and status == "survived" and name not in wording:
                table["survivors"][name] += 1
    return list(table.pop("survivors", ())) if survivors else table


def sample(workdir, per_module, patterns=(), seed=0):
    """A seeded sample of at most ``per_module`` mutants of each module (of those matching one of
    the glob ``patterns``, if any), wording mutants left out."""
    wording = wording_mutants(workdir)
    out = subprocess.run([os.path.join(workdir, ".venv", "bin", "mutmut"), "results", "--all", "true"],
                         cwd=workdir, capture_output=True, text=True, check=True).stdout
    modules = collections.defaultdict(list)
    for line in out.splitlines():
        name = line.strip().rpartition(": ")[0]
        if name and name not in wording and (not patterns or any(fnmatch.fnmatch(name, p) for p in patterns)):
            modules[re.split(r"\.x_|\.xǁ", name)[0]].append(name)
    rng = random.Random(seed)
    return sorted(name for names in modules.values()
                  for name in rng.sample(sorted(names), min(per_module, len(names))))


def run_in_process(workdir, patterns, tests):
    """Run the mutants matching ``patterns`` that have no result yet in this interpreter, ``pytest.main``
    per mutant (``MUTANT_UNDER_TEST`` set, which mutmut's trampolines read at every call) against
    ``tests`` only, recording each exit code in mutmut's meta files, where ``--results`` reads it. For a
    module whose own test file is fast while the tests that reach it (mutmut's choice) include the
    slowest suites: a second per mutant instead of a process start and minutes of tests. The copy's
    ``pyproject.toml`` puts the mutated tree first on ``sys.path``; wording mutants are left out."""
    import contextlib
    import io
    import json

    import pytest

    wording = wording_mutants(workdir)
    metas = glob.glob(os.path.join(workdir, "mutants", "cockpit_lite", "**", "*.py.meta"), recursive=True)
    os.chdir(os.path.join(workdir, "mutants"))
    for path in sorted(metas):
        with open(path, encoding="utf-8") as file:
            meta = json.load(file)
        codes = meta["exit_code_by_key"]
        for name in [n for n, code in codes.items() if code is None and n not in wording
                     and any(fnmatch.fnmatch(n, p) for p in patterns)]:
            os.environ["MUTANT_UNDER_TEST"] = name
            with contextlib.redirect_stdout(io.StringIO()):
                codes[name] = int(pytest.main(["-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider", *tests]))
            with open(path, "w", encoding="utf-8") as file:  # (after each: a run stopped keeps its results)
                json.dump(meta, file)
    os.environ.pop("MUTANT_UNDER_TEST", None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("group", choices=GROUPS)
    parser.add_argument("mutants", nargs="*", help="mutant names or globs (default: all of the group)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "cockpit-lite-mutation"))
    parser.add_argument("--results", action="store_true", help="only print the last run's results")
    parser.add_argument("--sample", type=int, metavar="K",
                        help="run and count only a seeded sample of K mutants per module (not its wording mutants; "
                             "of the MUTANT globs' if given)")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="the sample's random seed (default 0; with --results, the seed of the run to count)")
    parser.add_argument("--survivors", action="store_true", help="also list the surviving mutants")
    parser.add_argument("--in-process", action="append", metavar="TEST",
                        help="run the MUTANT globs without a result in this interpreter against TEST only "
                             "(repeatable; the copy's mutants must exist: a run of the group first)")
    args = parser.parse_args(argv)
    workdir = os.path.join(args.workdir, args.group)
    mutmut = os.path.join(workdir, ".venv", "bin", "mutmut")
    if args.in_process:
        if os.environ.get("OMP_NUM_THREADS") != "1":
            sys.exit("set OMP_NUM_THREADS=1 (the tests' results must not depend on the thread count)")
        run_in_process(workdir, args.mutants or ["*"], args.in_process)
        args.results = True
    if not args.results:
        if os.environ.get("OMP_NUM_THREADS") != "1":
            sys.exit("set OMP_NUM_THREADS=1 (forked mutant runs deadlock in OpenMP's thread pool)")
        copy_clone(workdir, args.group)
        if args.sample and not os.path.isdir(os.path.join(workdir, "mutants")):
            subprocess.run([mutmut, "run", "--max-children", "1", "no-such-mutant"], cwd=workdir, check=False)
    chosen = sample(workdir, args.sample, args.mutants, args.seed) if args.sample else None
    if not args.results:
        subprocess.run([mutmut, "run", "--max-children", "1", *(chosen or args.mutants)],
                       cwd=workdir, check=False)
    wording = wording_mutants(workdir)
    table = results(workdir, wording, chosen)
    for module, counts in sorted(table.items()):
        print(f"{module:<45} {sum(counts.values()):>5}  " + "  ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.survivors:
        print("\n".join(results(workdir, wording, chosen, survivors=True)))


if __name__ == "__main__":
    main()
