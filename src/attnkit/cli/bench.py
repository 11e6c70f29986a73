"""``attnkit bench``: runs ``benchmarks/run.py`` from the source checkout (arguments passed
through; the exit code is the script's own)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from attnkit.cli.common import UsageError

NAME = "bench"
EXAMPLES = """\
  bench     run benchmarks/run.py from the source checkout (arguments are passed through)
              attnkit bench --quick --only dense --json bench.json
              attnkit bench --scripts train,ddp --markdown
"""
PASSTHROUGH = True
"""Every argument after the verb goes to the script unparsed."""


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def find_bench_script() -> Path | None:
    """``benchmarks/run.py`` of the source checkout (next to ``src/``), else of the working
    directory; None when neither exists (e.g. attnkit installed without a checkout)."""
    for root in (_repo_root(), Path.cwd()):
        script = root / "benchmarks" / "run.py"
        if script.is_file():
            return script
    return None


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the verb (for --help; its arguments are not parsed)."""
    sub.add_parser(
        NAME,
        help="run the benchmarks (benchmarks/run.py in the source checkout)",
        description="Runs benchmarks/run.py from the source checkout with this Python; every "
        "argument after 'bench' is passed through (e.g. --quick, --only PATTERN, --json FILE).",
        add_help=False,
    )


def run_raw(args: Sequence[str]) -> int:
    """Run the benchmark script with ``args``; its exit code."""
    script = find_bench_script()
    if script is None:
        raise UsageError(
            "bench: benchmarks/run.py not found; the benchmarks live in the source checkout "
            f"(looked in {_repo_root() / 'benchmarks'} and {Path.cwd() / 'benchmarks'}); run "
            "'attnkit bench' from a git checkout of attnkit"
        )
    sys.stdout.flush()
    return subprocess.call([sys.executable, str(script), *args])
