"""The error contract checked by the invalid-call fuzz tests.

A bad argument must raise ``ValueError`` (wrong value) or ``TypeError`` (wrong type) whose
message starts with the name of the argument the user passed (``"num_heads: expected ..."``),
before any work; never another exception (RuntimeError, IndexError, OverflowError, ...) and
never a hang (each call gets :data:`TIMEOUT` seconds).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable

TIMEOUT = 20


class Hang(Exception):
    """The call did not return within TIMEOUT seconds."""


def _alarm(signum, frame):
    raise Hang(f"no answer within {TIMEOUT} s")


def run_bounded(thunk: Callable[[], object]) -> object:
    """``thunk()`` with a wall-clock limit (SIGALRM; the tests run in the main thread)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT)
    try:
        return thunk()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def expect_error(
    thunk: Callable[[], object], exc: type[Exception], names: str | tuple[str, ...], label: str
) -> None:
    """Assert that ``thunk()`` raises ``exc`` with a message starting with one of ``names``."""
    names = (names,) if isinstance(names, str) else names
    try:
        run_bounded(thunk)
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert type(e) is exc or isinstance(e, exc), (
            f"{label}: expected {exc.__name__}, got {type(e).__name__}: {msg}"
        )
        ok = any(re.match(rf"{re.escape(n)}\b", msg) for n in names)
        assert ok, f"{label}: message should start with {' or '.join(names)!r}: {msg}"
        return
    except Hang:
        raise AssertionError(f"{label}: hangs (no answer within {TIMEOUT} s)") from None
    except Exception as e:  # noqa: BLE001 - any other exception breaks the contract
        raise AssertionError(f"{label}: raised {type(e).__name__}: {e}") from e
    raise AssertionError(f"{label}: accepted (expected {exc.__name__} naming {names[0]!r})")
