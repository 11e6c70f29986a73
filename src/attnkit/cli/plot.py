"""``attnkit plot``: the training and held-out loss and the learning rate of one or more runs
against the step, overlaid in one image (from each run's ``log.jsonl``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnkit.cli.support.common import UsageError, one_line, option_names

NAME = "plot"
EXAMPLES = """\
  plot      training curves (loss, held-out loss, learning rate) of runs, overlaid
              attnkit plot runs/fra runs/fra-pack -o curves.png
"""

EPILOG = """\
examples:
  attnkit plot runs/copy -o copy.png
  attnkit plot runs/fra runs/fra-pack -o curves.svg     (two runs overlaid)

Each RUN is a run directory of 'attnkit train' (its log.jsonl is read; a run still training
can be plotted). The image type follows the extension: .png, .svg or .pdf.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb and its options."""
    p = sub.add_parser(
        NAME,
        help="training curves of one or more runs as an image",
        description="Plot the training loss, the held-out loss and the learning rate of each "
        "RUN against the optimiser step, the runs overlaid in one image.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help=".png, .svg or .pdf")


def _rows(run: str) -> list[dict]:
    log = Path(run) / "log.jsonl"
    if not log.is_file():
        raise UsageError(f"RUN: {run} is not a run directory of attnkit train (no log.jsonl)")
    rows = []
    lines = log.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                break  # the last line of a run still writing it
            raise UsageError(f"RUN: {log}:{n}: not a JSON line") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise UsageError(f"RUN: {log}:{n}: not a log row (no integer 'step')")
        rows.append(row)
    return rows


def run(ns: argparse.Namespace) -> int:
    """Plot; 0 on success."""
    from attnkit.viz.curves import Curve, write_curves
    from attnkit.viz.weights import check_output_path

    with option_names({"path": "--output", "curves": "RUN"}):
        check_output_path("path", ns.output, (".png", ".svg", ".pdf"))
        curves = [Curve.from_rows(r, _rows(r)) for r in ns.runs]
        write_curves(curves, ns.output)
    print(f"wrote {one_line(ns.output)} ({len(curves)} run(s))")
    return 0
