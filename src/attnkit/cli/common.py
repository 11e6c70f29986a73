"""Helpers shared by the verbs of the command line: the usage error, output, argument types."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["PROG", "UsageError", "console", "int_in", "print_json"]

PROG = "attnkit"


class UsageError(Exception):
    """A one-line message for stderr and exit code 2 (raised by verbs for user mistakes)."""


def console():
    """A rich console on stdout (no syntax highlighting of numbers or words)."""
    from rich.console import Console

    return Console(file=sys.stdout, highlight=False)


def print_json(obj: dict) -> None:
    """One JSON object on one line of stdout (NaN/inf refused: they are not JSON)."""
    sys.stdout.write(json.dumps(obj, allow_nan=False, ensure_ascii=False) + "\n")


def int_in(name: str, low: int, high: int | None = None):
    """An argparse ``type=`` that accepts an int in [low, high] (high None = no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            want = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"expected an integer {want}, got {value}")
        return value

    parse.__name__ = name
    return parse
