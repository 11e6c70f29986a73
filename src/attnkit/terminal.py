"""Showing untrusted text (a user's sentence, a path, a model's vocabulary) on a terminal.

Terminal control characters are shown escaped, never sent to the terminal: an ANSI escape
``"\\x1b[31m"`` in a token prints as the seven characters ``\\x1b[31m``. Escaped are the C0 and
C1 controls and DEL (``\\x00``-``\\x1f``, ``\\x7f``-``\\x9f``, which include ESC, CSI, BEL, CR
and newline), the Unicode bidirectional overrides and isolates (``\\u202e`` and friends, which
reorder what is displayed), the line and paragraph separators, and lone surrogates (undecodable
bytes in command-line arguments), which cannot be written as UTF-8.

Text given to rich is escaped for rich's markup too (:func:`markup`), so ``"[bold]"`` in a
sentence prints as ``[bold]``; or wrap it in a ``rich.text.Text`` (:func:`text`), which rich
never parses as markup. Torch-free; rich is imported only by :func:`markup` and :func:`text`.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["markup", "printable", "text"]

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]"
)


def _escape(m: re.Match) -> str:
    o = ord(m.group())
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def printable(s: object) -> str:
    """``str(s)`` with every terminal control character written as a Python-style escape
    (``\\x1b``, ``\\x9b``, ``\\u202e``); other characters, non-ASCII letters included, are kept."""
    return _UNSAFE.sub(_escape, str(s))


def markup(s: object) -> str:
    """:func:`printable` text, escaped for rich markup: safe inside an f-string that rich
    renders with markup (``f"[cyan]{markup(sentence)}[/]"``)."""
    from rich.markup import escape

    return escape(printable(s))


def text(s: object, style: str = "") -> Any:
    """A ``rich.text.Text`` of :func:`printable` text (rich never parses a Text as markup)."""
    from rich.text import Text

    return Text(printable(s), style=style)
