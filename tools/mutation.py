"""Mutation testing of one group of modules with mutmut (not part of CI: hours on 2 cores).

    OMP_NUM_THREADS=1 .venv/bin/python -m tools.mutation GROUP [--workdir DIR] [MUTANT ...]
    .venv/bin/python -m tools.mutation GROUP --results [--workdir DIR]

copies the files git tracks (and untracked ones it does not ignore) into ``DIR/GROUP``
(default: ``cockpit-lite-mutation`` in the temporary directory), links the clone's ``.venv``
there, narrows the copy's ``[tool.mutmut]`` (``pyproject.toml``) to the group's modules and
the tests that mirror them (``GROUPS``), runs ``mutmut run --max-children 1`` in the copy
and prints, per module, how many mutants were killed, survived, had no test, ...
(``--results``: only that, from the copy's last run). A mutant's test run is then the
group's tests that reach the mutated function, a few seconds. mutmut's working directory
(``mutants/``) stays in the copy and keeps its results: a run without ``MUTANT`` names
skips the mutants it has a result for, a run with names (or globs: survivors again after
a new test) runs those; delete ``DIR/GROUP`` for a fresh start. ``OMP_NUM_THREADS=1`` is
required (see the comment above ``[tool.mutmut]``). The scores and the equivalent mutants
are in docs/mutation.md.
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CURVATURE = ["curvature.py", "hess_trace.py", "tic.py", "tic_diag.py", "tic_trace.py"]

#: group -> (modules to mutate, test selection, extra pytest arguments, modules left out)
GROUPS = {
    "engine_rules": (["cockpit_lite/engine/rules/*"], ["tests/engine/"], [], []),
    "subsample_histogram_log": (
        ["cockpit_lite/subsample.py", "cockpit_lite/histogram.py", "cockpit_lite/log/*"],
        ["tests/test_subsample.py", "tests/test_histogram.py", "tests/test_histogram_properties.py",
         "tests/test_log.py", "tests/instruments/test_readers.py"], [], []),
    "quantities": (["cockpit_lite/quantities/*"], ["tests/quantities/"], [],
                   [f"cockpit_lite/quantities/{name}" for name in CURVATURE]),
    "quantities_curvature": ([f"cockpit_lite/quantities/{name}" for name in CURVATURE], ["tests/quantities/"], [], []),
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


def copy_clone(destination, group):
    """The clone's files (tracked, or untracked and not ignored) copied over ``destination``, with
    the narrowed configuration and a link to the clone's ``.venv``."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = os.path.join(ROOT, name)
        if os.path.isfile(source):
            os.makedirs(os.path.dirname(os.path.join(destination, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(destination, name))
    if not os.path.lexists(os.path.join(destination, ".venv")):
        os.symlink(os.path.join(ROOT, ".venv"), os.path.join(destination, ".venv"))
    path = os.path.join(destination, "pyproject.toml")
    with open(path, encoding="utf-8") as file:
        config = file.read()
    with open(path, "w", encoding="utf-8") as file:
        file.write(narrowed(config, group))


def results(workdir):
    """``{module: Counter(status)}`` of the last run in ``workdir``."""
    out = subprocess.run([os.path.join(workdir, ".venv", "bin", "mutmut"), "results", "--all", "true"],
                         cwd=workdir, capture_output=True, text=True, check=True).stdout
    table = collections.defaultdict(collections.Counter)
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            table[re.split(r"\.x_|\.xǁ", name)[0]][status] += 1
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("group", choices=GROUPS)
    parser.add_argument("mutants", nargs="*", help="mutant names or globs (default: all of the group)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "cockpit-lite-mutation"))
    parser.add_argument("--results", action="store_true", help="only print the last run's results")
    args = parser.parse_args(argv)
    workdir = os.path.join(args.workdir, args.group)
    if not args.results:
        if os.environ.get("OMP_NUM_THREADS") != "1":
            sys.exit("set OMP_NUM_THREADS=1 (forked mutant runs deadlock in OpenMP's thread pool)")
        copy_clone(workdir, args.group)
        subprocess.run([os.path.join(workdir, ".venv", "bin", "mutmut"), "run", "--max-children", "1", *args.mutants],
                       cwd=workdir, check=False)
    for module, counts in sorted(results(workdir).items()):
        print(f"{module:<45} {sum(counts.values()):>5}  " + "  ".join(f"{k} {v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
