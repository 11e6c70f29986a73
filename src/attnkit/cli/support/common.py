"""Helpers shared by the verbs of the command line: the usage error, the argument parser,
option names in library errors, output, text arguments (the options themselves:
:mod:`attnkit.cli.support.options`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import NoReturn

from attnkit.terminal import printable

__all__ = [
    "PROG",
    "ArgumentParser",
    "UsageError",
    "console",
    "one_line",
    "option_names",
    "print_json",
    "said",
    "utf8_text",
]

PROG = "attnkit"


class UsageError(Exception):
    """A one-line message for stderr and exit code 2 (raised by verbs for user mistakes)."""


def utf8_text(option: str, text: str, where: str = "") -> str:
    """``text`` from the command line or standard input, refused with a :class:`UsageError`
    naming ``option`` when it is not UTF-8 (Python keeps such bytes as lone surrogates, which
    the tokenizers cannot encode); ``where`` locates it, e.g. " line 3"."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        byte = text[e.start].encode("utf-8", "surrogateescape")[0]
        raise UsageError(
            f"{option}{where}: not UTF-8 text (byte 0x{byte:02x} at offset {e.start})"
        ) from None
    return text


def said(e: BaseException) -> str:
    """What an exception says, for a user: an operating-system error on a file as "FILE:
    REASON" (not Python's "[Errno 13] Permission denied: 'FILE'"), anything else as ``str``."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e)


def one_line(message: object) -> str:
    """``message`` on one line: whitespace runs collapsed, control characters escaped."""
    return printable(" ".join(str(message).split()))


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line on stderr (exit code 2), with the
    offending text shown escaped; ``--help`` still prints the full usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, except that a verb's parser refuses what it does not know itself, so
        the error names the verb and its ``--help`` (argparse leaves them to the top-level
        parser, which said ``attnkit: error: unrecognized arguments`` and pointed to
        ``attnkit --help``, where no verb's options are listed)."""
        ns, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != PROG:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


_FILE_WIDTH = 100  # rules and panels off a terminal


def console():
    """A rich console on stdout (no syntax highlighting of numbers or words). Untrusted text
    goes through :mod:`attnkit.terminal` before it reaches it.

    Off a terminal (a pipe, a file) and without ``COLUMNS``, nothing is wrapped: lines and
    tables keep their natural width, so no word or path is broken across lines; rules are
    100 columns wide."""
    from rich.console import Console
    from rich.rule import Rule

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console(file=sys.stdout, highlight=False)

    class FileConsole(Console):
        """Wide enough for any line; rules drawn 100 columns wide."""

        def rule(self, title="", *, characters="─", style="rule.line", align="center"):
            rule = Rule(title, characters=characters, style=style, align=align)
            self.print(rule, width=_FILE_WIDTH)

    return FileConsole(file=sys.stdout, highlight=False, width=10_000, soft_wrap=True)


# JSON strings may hold C1 controls, DEL, bidi overrides and separators unescaped when
# ensure_ascii is off; escape them too (they can only occur inside strings).
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def print_json(obj: dict) -> None:
    """One JSON object on one line of stdout (NaN/inf refused: they are not JSON); every
    terminal control character inside a string is written as a ``\\uXXXX`` escape."""
    text = json.dumps(obj, allow_nan=False, ensure_ascii=False)
    text = _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    sys.stdout.write(text.encode("utf-8", "backslashreplace").decode("utf-8") + "\n")


@contextlib.contextmanager
def option_names(names: Mapping[str, str]) -> Iterator[None]:
    """Inside the block, a library ValueError / TypeError / OSError whose message starts with an
    argument name from ``names`` becomes a :class:`UsageError` naming the command-line option
    instead (``"d_model: expected ..."`` -> ``"--d-model: expected ..."``). The library does
    the checking; the CLI only translates the names."""
    try:
        yield
    except (ValueError, TypeError, OSError) as e:
        head, sep, rest = str(e).partition(":")
        if sep and head in names:
            raise UsageError(f"{names[head]}:{rest}") from e
        raise
