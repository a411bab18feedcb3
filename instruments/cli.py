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
"""

import argparse
import os
import sys

from .compare import ROWS, compare
from .dashboard import Dashboard
from .gauges import GAUGES


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m instruments",
        description="Render cockpit-lite logs: one dashboard, or several runs side by side (--compare).",
    )
    parser.add_argument("logs", nargs="+", help=".jsonl or .json log(s)")
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
    return parser


def diagnose_main(argv):
    """``python -m instruments diagnose RUN.jsonl``: print the diagnosis report; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m instruments diagnose",
                                     description="Print the diagnosis of a cockpit-lite log: findings first, then "
                                                 "per-layer statistics.")
    parser.add_argument("log", help=".jsonl log (a .json record gives parameter numbers instead of names)")
    args = parser.parse_args(argv)
    from cockpit_lite.diagnosis import report  # plain Python on the record: no torch

    try:
        print(report(args.log))
    except (FileNotFoundError, ValueError, KeyError) as error:
        parser.error(str(error))
    return 0


def main(argv=None):
    """Run the command line; returns 0 (errors exit through argparse with status 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["diagnose"]:
        return diagnose_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args, parser)
    except (FileNotFoundError, ValueError, KeyError) as error:  # unreadable or foreign logs
        parser.error(str(error))


def _run(args, parser):
    if len(args.logs) > 1 and not args.compare:
        parser.error("several logs given: add --compare to draw them side by side")
    if args.compare:
        output = args.output or "comparison.png"
        from . import data

        runs = [data.load(path, discard=args.discard) for path in args.logs]
        compare(runs, labels=args.labels, rows=args.rows, overlay=not args.no_overlay,
                figsize=tuple(args.size) if args.size else None, dpi=args.dpi, title=args.title,
                savepath=output, log_steps=args.log_steps)
    else:
        from . import data

        log = args.logs[0]
        output = args.output or os.path.splitext(data.resolve_path(log))[0] + ".png"
        run = data.load(log, discard=args.discard)
        dashboard = Dashboard(figsize=tuple(args.size) if args.size else (16, 10), dpi=args.dpi,
                              layerwise=args.layerwise, log_steps=args.log_steps, title=args.title)
        dashboard.save(run, output)
    print(output)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
