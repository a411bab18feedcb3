"""Command line: ``python -m instruments RUN.jsonl -o dashboard.png``.

Renders any cockpit-lite log offline (``.jsonl`` or ``.json``), including one whose
last line was torn by a crash: everything complete is drawn and the reader warns
once. Several logs with ``--compare`` draw the comparison view::

    python -m instruments RUN.jsonl -o dashboard.png
    python -m instruments RUN.jsonl --layerwise --dpi 150
    python -m instruments a.jsonl b.jsonl c.jsonl --compare --labels "η=0.01" "η=0.1" "η=1" -o cmp.png
    python -m instruments a.jsonl b.jsonl --compare --rows alpha grad_norm performance

Defaults: the dashboard goes next to the log as ``<log name>.png``; a comparison to
``comparison.png`` in the current folder. The written path is printed.

``python -m instruments diagnose RUN.jsonl`` prints the diagnosis report instead: the
findings (the rules of ``cockpit_lite.diagnosis``, run offline on the log: the same
findings a live ``Cockpit(model, log=...)`` reported), then per-layer tables of the
activation, gradient and input statistics of the last recorded step. The rules are
plain Python on the record, so this imports neither torch nor model code either.

A log that several runs appended to (one *run segment* each, see ``cockpit_lite.log``)
is drawn from its last segment, with a note on stderr; ``--segment I`` picks another
(an index as for a Python list, or a run id). Files are validated as they are read,
and their sizes bounded (``cockpit_lite.log.LIMITS``; ``--limit NAME=N`` raises one
for a file you trust). Any bad input ends in one line ``error: ...`` on stderr and
exit status 2, never a traceback.
"""

import argparse
import os
import sys

from .compare import ROWS, compare
from .dashboard import Dashboard
from .gauges import GAUGES

USAGE = ("python -m instruments [options] LOG [LOG ...]\n"
         "       python -m instruments diagnose [options] LOG")


class InputError(Exception):
    """Bad input found by the command line itself (printed as ``error: ...``, exit 2)."""


def _segment(text):
    """``--segment``: an integer index, or a run id."""
    try:
        return int(text)
    except ValueError:
        return text


def _limit(text):
    """``--limit NAME=N``."""
    from cockpit_lite import log

    name, _, value = text.partition("=")
    if name not in log.LIMITS:
        raise argparse.ArgumentTypeError(f"unknown limit {name!r}; known: {', '.join(log.LIMITS)}")
    try:
        number = int(float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--limit {text!r}: expected NAME=N with a number N") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"--limit {text!r}: N must be positive")
    return name, number


def _add_reading(parser):
    parser.add_argument("--segment", type=_segment, default=-1, metavar="I",
                        help="run segment of a log several runs appended to: an index (default -1: the last) "
                             "or a run id")
    parser.add_argument("--limit", type=_limit, action="append", default=[], metavar="NAME=N",
                        help="raise a reader bound for a file you trust (max_line_bytes, max_file_bytes, "
                             "max_items, max_array_bytes, max_depth; see cockpit_lite.log.LIMITS)")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m instruments",
        usage=USAGE,
        description="Render cockpit-lite logs: one dashboard, or several runs side by side (--compare).",
        epilog="subcommands:\n  diagnose LOG   print the diagnosis report of a log: findings, then per-layer "
               "statistics\n                 (python -m instruments diagnose --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("logs", nargs="+", metavar="LOG", help=".jsonl or .json log(s)")
    parser.add_argument("-o", "--output", help="output file (PNG unless the extension says otherwise)")
    parser.add_argument("--compare", action="store_true", help="draw the runs side by side")
    parser.add_argument("--labels", nargs="+", help="run labels for --compare (default: file names)")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(GAUGES), metavar="GAUGE",
                        help=f"gauges per run for --compare (default: {' '.join(ROWS)}; any of {', '.join(GAUGES)})")
    parser.add_argument("--no-overlay", action="store_true", help="--compare without the overlaid loss panel")
    parser.add_argument("--title", help="figure title")
    parser.add_argument("--dpi", type=int, default=100, help="resolution (default 100)")
    parser.add_argument("--size", nargs=2, type=float, metavar=("W", "H"), help="figure size in inches")
    parser.add_argument("--layerwise", action="store_true", help="add a row of per-layer histograms")
    parser.add_argument("--log-steps", action="store_true", help="symlog step axes")
    parser.add_argument("--discard", type=int, help="ignore steps after this one")
    _add_reading(parser)
    return parser


def _one_line(error, paths):
    """The message of a failure while reading or drawing ``paths``, on one line."""
    where = ", ".join(map(str, paths))
    if isinstance(error, KeyError):
        text = f"{where}: missing key {error.args[0]!r}" if error.args else f"{where}: missing key"
    elif isinstance(error, MemoryError):
        text = f"{where}: out of memory while reading it (a smaller --limit refuses such files earlier)"
    elif isinstance(error, (OSError, ValueError, InputError)):
        text = str(error)
        if paths and not any(str(p) in text for p in paths):
            text = f"{where}: {text}"
    else:
        text = f"{where}: {type(error).__name__}: {error}"
    return " ".join(text.split())


def _fail(error, paths):
    print(f"error: {_one_line(error, paths)}", file=sys.stderr)
    raise SystemExit(2)


def diagnose_main(argv):
    """``python -m instruments diagnose RUN.jsonl``: print the diagnosis report; returns 0 (2 for bad input)."""
    parser = argparse.ArgumentParser(prog="python -m instruments diagnose",
                                     description="Print the diagnosis of a cockpit-lite log: findings first, then "
                                                 "per-layer statistics.")
    parser.add_argument("log", help=".jsonl log (a .json record gives parameter numbers instead of names)")
    _add_reading(parser)
    args = parser.parse_args(argv)
    # plain Python on the record: no torch
    from cockpit_lite.diagnosis.diagnose import Diagnosis, _source
    from cockpit_lite.diagnosis.report import format_report

    try:
        if not os.path.isfile(args.log):
            raise FileNotFoundError(f"no log at {args.log!r} (no such file)")
        record, names, shapes = _source(args.log, args.segment, dict(args.limit))
        diagnosis = Diagnosis(names, shapes)
        diagnosis.feed_record(record)
        text = format_report(diagnosis.findings, record, names)
    except Exception as error:  # any bad input: one line, exit 2
        _fail(error, [args.log])
    print(text)
    return 0


def main(argv=None):
    """Run the command line; returns 0. Bad input prints ``error: ...`` and exits with status 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["diagnose"]:
        return diagnose_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.logs) > 1 and not args.compare:
        parser.error("several logs given: add --compare to draw them side by side")
    try:
        return _run(args)
    except Exception as error:  # unreadable, foreign or hostile logs: one line, never a traceback
        _fail(error, args.logs)


def _load(path, args):
    from . import data

    run = data.load(path, discard=args.discard, segment=args.segment, limits=dict(args.limit))
    if run.segments > 1:
        print(f"note: {run.path} holds {run.segments} run segments (runs appended to one log); drawing "
              f"{'the last' if args.segment == -1 else f'segment {args.segment}'}, run {run.header.get('run')!r} "
              f"({len(run.record)} steps); --segment I picks another", file=sys.stderr)
    return run


def _run(args):
    from . import data

    with data.literal_text():  # text from the files is drawn as it is, never as mathtext
        if args.compare:
            output = args.output or "comparison.png"
            runs = [_load(path, args) for path in args.logs]
            compare(runs, labels=args.labels, rows=args.rows, overlay=not args.no_overlay,
                    figsize=tuple(args.size) if args.size else None, dpi=args.dpi, title=args.title,
                    savepath=output, log_steps=args.log_steps)
        else:
            log = args.logs[0]
            output = args.output or os.path.splitext(data.resolve_path(log))[0] + ".png"
            run = _load(log, args)
            dashboard = Dashboard(figsize=tuple(args.size) if args.size else (16, 10), dpi=args.dpi,
                                  layerwise=args.layerwise, log_steps=args.log_steps, title=args.title)
            dashboard.save(run, output)  # atomic (Dashboard.save)
    print(output)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
