"""``attnkit bench``: runs ``benchmarks/run.py`` from the source checkout (arguments passed
through; the exit code is the script's own). The benchmarks are not part of the installed
package: outside a checkout, ``attnkit bench --help`` says what it needs and any other use is a
one-line error saying the same."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from attnkit.cli.support.common import UsageError

NAME = "bench"
EXAMPLES = """\
  bench     run the benchmarks (needs a source checkout of attnkit; arguments passed through)
              attnkit bench --quick --only dense --json bench.json
              attnkit bench --scripts train,ddp --markdown
"""
PASSTHROUGH = True
"""Every argument after the verb goes to the script unparsed."""

NEEDS = (
    "the benchmarks are not part of the installed package: they need a source checkout of "
    "attnkit (git clone, then pip install -e '.[dev]' inside it); run 'attnkit bench' from "
    "inside that checkout"
)
"""What ``attnkit bench`` needs, said when it is missing."""


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
        help="run the benchmarks (needs a source checkout of attnkit)",
        description="Runs the benchmarks of a source checkout of attnkit with this Python; "
        "every argument after 'bench' is passed through (e.g. --quick, --only PATTERN, "
        "--json FILE); 'attnkit bench --help' lists them.",
        add_help=False,
    )


def run_raw(args: Sequence[str]) -> int:
    """Run the benchmark script with ``args``; its exit code."""
    script = find_bench_script()
    if script is None:
        looked = f"looked for benchmarks/run.py in {_repo_root()} and {Path.cwd()}"
        if any(a in ("-h", "--help") for a in args):
            text = textwrap.fill(f"Runs the attnkit benchmarks; {NEEDS} ({looked}).", 79)
            print(f"usage: attnkit bench [OPTIONS]\n\n{text}")
            return 0
        raise UsageError(f"bench: {NEEDS} ({looked})")
    sys.stdout.flush()
    env = {**os.environ, "ATTNKIT_BENCH_PROG": "attnkit bench"}  # benchmarks/run.py's PROG_ENV
    return subprocess.call([sys.executable, str(script), *args], env=env)
