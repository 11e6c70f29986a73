"""Argument checks shared by every layer of attnkit (torch-free: the reference imports it too).

One wording and one exception type per kind of mistake, so a user sees the same message whether
the bad value went into ``reference``, ``masks``, ``functional``, ``nn``, ``models`` or the CLI:

- the wrong *type* (a str where an int is meant, a bool where a number is meant, a float where
  an int is meant) raises ``TypeError``;
- the right type with a wrong *value* (0 heads, a probability of 1.5, NaN) raises ``ValueError``.

Every message starts with the argument's name as the user passed it, then says what was
expected and what was got: ``"num_heads: expected a positive int, got 0"``.

``bool`` is never accepted where a number is meant (``True`` is an ``int`` in Python, but
``num_heads=True`` is a mistake), and only real ``bool`` values (Python or NumPy) are accepted
as flags (``bias='no'`` is truthy, and a mistake).

Integers are limited to ``MAX_INT`` (2**62) by default: larger values cannot be represented by
the int64 index arithmetic the kernels use, and are refused here rather than overflowing later.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MAX_INT",
    "choice",
    "finite_float",
    "flag",
    "integer",
    "nonnegative_int",
    "positive_float",
    "positive_int",
    "probability",
    "show",
]

MAX_INT = 2**62
"""Largest int accepted by the int checks unless a call sets its own ``maximum``."""


def show(x: object, limit: int = 80) -> str:
    """``repr(x)`` cut to ``limit`` characters (messages stay one readable line)."""
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_numpy_bool(x: object) -> bool:
    """numpy.bool_ (named ``bool`` since NumPy 2), without importing NumPy."""
    return type(x).__module__ == "numpy" and type(x).__name__ in ("bool_", "bool")


def _is_int(x: object) -> bool:
    if isinstance(x, bool) or _is_numpy_bool(x):
        return False
    return isinstance(x, numbers.Integral)


def _is_real(x: object) -> bool:
    if isinstance(x, bool) or _is_numpy_bool(x):
        return False
    return isinstance(x, numbers.Real)


def integer(
    name: str,
    x: object,
    minimum: int | None = None,
    maximum: int | None = MAX_INT,
    what: str | None = None,
) -> int:
    """``x`` as a Python int in [minimum, maximum] (either bound None = open).

    TypeError for a non-int (bool and float included), ValueError outside the bounds. ``what``
    replaces the default description ("an int >= 1", ...) in the message.
    """
    if type(x) is int and (minimum is None or x >= minimum) and (maximum is None or x <= maximum):
        return x  # the common case, without the numbers.Integral check (checks run per call)
    if what is None:
        if minimum is not None and maximum is not None and maximum != MAX_INT:
            what = f"an int in [{minimum}, {maximum}]"
        elif minimum is not None:
            what = f"an int >= {minimum}"
        elif maximum is not None and maximum != MAX_INT:
            what = f"an int <= {maximum}"
        else:
            what = "an int"
    if not _is_int(x):
        raise TypeError(f"{name}: expected {what}, got {show(x)} ({type(x).__name__})")
    n = int(x)  # type: ignore[call-overload]
    if (minimum is not None and n < minimum) or (maximum is not None and n > maximum):
        if maximum == MAX_INT and n > maximum:
            what = f"{what} (at most 2**62)"
        raise ValueError(f"{name}: expected {what}, got {n}")
    return n


def positive_int(name: str, x: object, maximum: int | None = MAX_INT) -> int:
    """``x`` as an int >= 1 (TypeError for non-ints and bools, ValueError for <= 0)."""
    what = "a positive int" if maximum in (None, MAX_INT) else f"a positive int <= {maximum}"
    return integer(name, x, 1, maximum, what)


def nonnegative_int(name: str, x: object, maximum: int | None = MAX_INT) -> int:
    """``x`` as an int >= 0 (TypeError for non-ints and bools, ValueError for < 0)."""
    what = "a non-negative int" if maximum in (None, MAX_INT) else f"an int in [0, {maximum}]"
    return integer(name, x, 0, maximum, what)


def finite_float(name: str, x: object, what: str = "a finite number") -> float:
    """``x`` as a finite float (TypeError for non-numbers and bools, ValueError for NaN/inf)."""
    if not _is_real(x):
        raise TypeError(f"{name}: expected {what}, got {show(x)} ({type(x).__name__})")
    f = float(x)  # type: ignore[arg-type]
    if not math.isfinite(f):
        raise ValueError(f"{name}: expected {what}, got {show(x)}")
    return f


def positive_float(name: str, x: object) -> float:
    """``x`` as a finite float > 0."""
    f = finite_float(name, x, "a positive finite number")
    if f <= 0:
        raise ValueError(f"{name}: expected a positive finite number, got {show(x)}")
    return f


def probability(name: str, x: object, *, allow_one: bool = False) -> float:
    """``x`` as a float in [0, 1) (or [0, 1] with ``allow_one``), e.g. a dropout rate."""
    what = "a number in [0, 1]" if allow_one else "a number in [0, 1)"
    f = finite_float(name, x, what)
    if not (0.0 <= f < 1.0 or (allow_one and f == 1.0)):
        raise ValueError(f"{name}: expected {what}, got {show(x)}")
    return f


def flag(name: str, x: object) -> bool:
    """``x`` as a bool; only real bools are accepted (``'no'`` and ``1`` are TypeErrors)."""
    if isinstance(x, bool):
        return x
    if _is_numpy_bool(x):
        return bool(x)
    raise TypeError(f"{name}: expected a bool (True or False), got {show(x)} ({type(x).__name__})")


def choice(name: str, x: object, options: Iterable[Any]) -> Any:
    """``x`` if it is one of ``options`` (compared with ==), else ValueError listing them.

    A value of another type than every option (``None`` for a str choice, say) is a TypeError.
    """
    opts = tuple(options)
    listed = ", ".join(repr(o) for o in opts)
    if opts and not any(type(x) is type(o) for o in opts):
        raise TypeError(f"{name}: expected one of {listed}, got {show(x)} ({type(x).__name__})")
    if x not in opts:
        raise ValueError(f"{name}: expected one of {listed}, got {show(x)}")
    return x
