"""The ``attnkit`` command line (also ``python -m attnkit``).

One module per verb in this package; each has ``NAME``, ``EXAMPLES`` (lines for the top-level
``--help``), ``add_parser(subparsers)`` and ``run(namespace) -> int`` (or ``run_raw(args)`` for a
verb whose arguments are passed through unparsed, like ``bench``). To add a verb, add its module
to ``VERBS``.

Fast start (``attnkit --help``, ``attnkit VERB --help`` and ``--version`` import neither torch
nor numpy; tests/cli/test_startup.py checks every verb, benchmarks/bench_startup.py times it):
building the parser imports every verb module, so a verb module imports at its top only the
standard library, :mod:`attnkit.cli.support` modules that are light at their top and torch-
and numpy-free modules (``attnkit.checks``, ``attnkit.train.config``,
``attnkit.explain.catalog``). Everything else is imported inside ``run()``::

    def run(ns: argparse.Namespace) -> int:
        from attnkit.train.inference import metrics   # heavy: torch, numpy
        from attnkit.train.inference import session
        ...

Defaults shown in ``--help`` come from such light modules, never from a module that imports
torch. The packages ``attnkit``, ``attnkit.explain`` and ``attnkit.train`` import their public
names on first use (:mod:`attnkit.lazy`), so importing a light submodule stays light.

Exit codes: 0 success; 2 a user mistake (bad usage, a missing or unreadable file, bad data:
what attnkit's own checks raise, :mod:`attnkit.cli.support.errors`), reported as one line on stderr,
never a traceback; 1 an unexpected internal error, reported as
one line that says so and where to report it; ``bench`` returns the benchmark script's own code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType

from attnkit.cli.support.common import PROG, ArgumentParser, one_line, said
from attnkit.cli.support.errors import is_user_error

__all__ = ["VERBS", "build_parser", "main"]

VERBS = (
    "explain",
    "view",
    "info",
    "tune",
    "train",
    "evaluate",
    "translate",
    "generate",
    "score",
    "plot",
    "export",
    "bench",
)
"""The verb modules of this package, in the order ``--help`` lists them."""

REPORT = (
    "this is a bug in attnkit, not a problem with your input: please report it in the attnkit "
    "issue tracker with the command you ran and the output of 'attnkit info' (run with "
    "ATTNKIT_TRACEBACK=1 to print the traceback)"
)


def _verbs() -> list[ModuleType]:
    return [importlib.import_module(f"attnkit.cli.{name}") for name in VERBS]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (verbs as sub-commands)."""
    from attnkit import __version__

    verbs = _verbs()
    epilog = "verbs and examples:\n" + "".join(m.EXAMPLES for m in verbs)
    epilog += '\nrun "attnkit VERB --help" for every option of a verb.\n'
    parser = ArgumentParser(
        prog=PROG,
        description="attnkit: attention, exact and fast.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="{" + ",".join(m.NAME for m in verbs) + "}")
    for m in verbs:
        m.add_parser(sub)
    return parser


def _error(verb: str | None, e: BaseException) -> str:
    """``attnkit VERB: error: MESSAGE`` on one line."""
    msg = one_line(said(e) or type(e).__name__)
    if verb and msg.startswith(f"{verb}:"):
        msg = msg[len(verb) + 1 :].lstrip()
    return f"{PROG} {verb}: error: {msg}" if verb else f"{PROG}: error: {msg}"


def _run(argv: list[str]) -> int:
    for m in _verbs():
        if getattr(m, "PASSTHROUGH", False) and argv and argv[0] == m.NAME:
            return m.run_raw(argv[1:])
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.verb is None:
        parser.print_help()
        return 2
    return importlib.import_module(f"attnkit.cli.{ns.verb}").run(ns)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (``python -m attnkit`` exits with it).

    Never lets a traceback reach the user: a user mistake (bad usage, a missing, unreadable or
    corrupt file, a bad value: what attnkit's own checks raise,
    :mod:`attnkit.cli.support.errors`) is one line on stderr and exit code 2; anything else
    (a dependency's error included) is one line that says it is an internal error and how to
    report it, exit code 1, with the traceback when ATTNKIT_TRACEBACK=1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = argv[0] if argv and argv[0] in VERBS else None
    try:
        return _run(argv)
    except SystemExit as e:  # argparse: --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (attnkit ... | head): stop quietly
        _silence_stdout()
        return 1
    except Exception as e:  # noqa: BLE001 - the last line of defence: never a traceback
        if is_user_error(e):  # attnkit's own checks (attnkit.cli.support.errors)
            print(_error(verb, e), file=sys.stderr)
            return 2
        if os.environ.get("ATTNKIT_TRACEBACK") == "1":
            traceback.print_exc()
        where = f"{PROG} {verb}" if verb else PROG
        print(
            f"{where}: internal error ({type(e).__name__}: {one_line(e)}); {REPORT}",
            file=sys.stderr,
        )
        return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
