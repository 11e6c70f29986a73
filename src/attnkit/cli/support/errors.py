"""Which exceptions the command line reports as a user's mistake (one line, exit code 2) and
which as a bug (internal error, exit code 1, the traceback with ``ATTNKIT_TRACEBACK=1``).

A user error is one that attnkit's own checks raise: a
:class:`~attnkit.cli.support.common.UsageError`, or a ``ValueError``/``TypeError``/``OSError``
(attnkit's argument, file and data checks raise these, with messages that name the argument or
file, :mod:`attnkit.checks`) whose traceback ends at a ``raise`` statement in attnkit's own
source. The same types raised by a dependency
(transformers, torch, tokenizers) or by Python itself inside attnkit (``int("x")`` on a value
attnkit should have checked) are internal errors: they mean attnkit let bad input through or
has a bug. Two kinds of dependency errors still mean a bad file or machine, not a bug: an
``OSError`` of the operating system (it carries an errno: a missing file, no permission, a full
disk) and safetensors' error for a corrupt weights file.
"""

from __future__ import annotations

import linecache
from pathlib import Path
from types import TracebackType

from attnkit.cli.support.common import UsageError

__all__ = ["is_user_error", "raised_by_attnkit"]

_PACKAGE = Path(__file__).resolve().parents[2]
"""The directory of the attnkit package: its own source files are below it."""


def _last_frame(tb: TracebackType | None) -> TracebackType | None:
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def raised_by_attnkit(e: BaseException) -> bool:
    """Whether ``e`` was raised by a ``raise`` statement in attnkit's source (the innermost
    frame of its traceback is in the package and its line is a ``raise``)."""
    tb = _last_frame(e.__traceback__)
    if tb is None:
        return False
    filename = tb.tb_frame.f_code.co_filename
    try:
        inside = Path(filename).resolve().is_relative_to(_PACKAGE)
    except (OSError, ValueError):
        return False
    return inside and linecache.getline(filename, tb.tb_lineno).lstrip().startswith("raise")


def is_user_error(e: BaseException) -> bool:
    """Whether the command line reports ``e`` as a user's mistake (see the module docstring)."""
    if isinstance(e, UsageError):
        return True
    if isinstance(e, OSError) and e.errno is not None:
        return True
    if type(e).__name__ == "SafetensorError" and type(e).__module__.startswith("safetensors"):
        return True
    return isinstance(e, (ValueError, TypeError, OSError)) and raised_by_attnkit(e)
