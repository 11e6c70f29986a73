"""The ``attnkit`` command line (also ``python -m attnkit``).

One module per verb in this package; each has ``NAME``, ``EXAMPLES`` (lines for the top-level
``--help``), ``add_parser(subparsers)`` and ``run(namespace) -> int`` (or ``run_raw(args)`` for a
verb whose arguments are passed through unparsed, like ``bench``). To add a verb, add its module
to ``VERBS``.

Exit codes: 0 success; 2 a user mistake (bad usage, a missing or unreadable file, bad data),
reported as one line on stderr, never a traceback; 1 an unexpected internal error, reported as
one line that says so and where to report it; ``bench`` returns the benchmark script's own code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from attnkit.cli.common import PROG, UsageError

__all__ = ["VERBS", "build_parser", "main"]

VERBS = ("explain", "bench")
"""The verb modules of this package, in the order ``--help`` lists them."""

REPORT = "please report it at the attnkit issue tracker with the command you ran"


def _verbs() -> list[ModuleType]:
    return [importlib.import_module(f"attnkit.cli.{name}") for name in VERBS]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (verbs as sub-commands)."""
    from attnkit import __version__

    verbs = _verbs()
    epilog = "verbs and examples:\n" + "".join(m.EXAMPLES for m in verbs)
    epilog += '\nrun "attnkit VERB --help" for every option of a verb.\n'
    parser = argparse.ArgumentParser(
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


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (``python -m attnkit`` exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        for m in _verbs():
            if getattr(m, "PASSTHROUGH", False) and argv and argv[0] == m.NAME:
                return m.run_raw(argv[1:])
        parser = build_parser()
        ns = parser.parse_args(argv)
        if ns.verb is None:
            parser.print_help()
            return 2
        return importlib.import_module(f"attnkit.cli.{ns.verb}").run(ns)
    except SystemExit as e:  # argparse: --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except UsageError as e:
        print(f"{PROG} {_one_line(e)}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError, UnicodeError) as e:
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the last line of defence: never a traceback
        print(
            f"{PROG}: internal error ({type(e).__name__}: {_one_line(e)}); {REPORT}",
            file=sys.stderr,
        )
        return 1
