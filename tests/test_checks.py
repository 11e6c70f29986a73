"""attnkit.checks: one exception type per kind of mistake (TypeError for a wrong type,
ValueError for a wrong value), messages that start with the argument's name, and the plain-int
fast path accepting exactly what the general path accepts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnkit import checks


@pytest.mark.parametrize(
    "fn, args, exc, words",
    [
        (checks.positive_int, ("n", 0), ValueError, "n: expected a positive int, got 0"),
        (checks.positive_int, ("n", -3), ValueError, "n: expected a positive int"),
        (checks.positive_int, ("n", True), TypeError, "n: expected a positive int, got True"),
        (checks.positive_int, ("n", 2.0), TypeError, "n: expected a positive int"),
        (checks.positive_int, ("n", "3"), TypeError, "n: expected a positive int"),
        (checks.positive_int, ("n", 2**62 + 1), ValueError, "(at most 2**62)"),
        (checks.positive_int, ("n", 9, 8), ValueError, "n: expected a positive int <= 8, got 9"),
        (checks.nonnegative_int, ("k", -1), ValueError, "k: expected a non-negative int"),
        (checks.integer, ("i", 5, 0, 4), ValueError, "i: expected an int in [0, 4], got 5"),
        (checks.integer, ("i", -1, 0, None), ValueError, "i: expected an int >= 0, got -1"),
        (checks.probability, ("p", 1.0), ValueError, "p: expected a number in [0, 1)"),
        (checks.probability, ("p", math.nan), ValueError, "p: expected a number in [0, 1)"),
        (checks.probability, ("p", False), TypeError, "p: expected a number in [0, 1)"),
        (checks.positive_int, ("n", np.True_), TypeError, "n: expected a positive int"),
        (checks.positive_float, ("s", 0.0), ValueError, "s: expected a positive finite number"),
        (checks.finite_float, ("x", math.inf), ValueError, "x: expected a finite number"),
        (checks.flag, ("bias", "no"), TypeError, "bias: expected a bool (True or False)"),
        (checks.flag, ("bias", 1), TypeError, "bias: expected a bool"),
        (checks.choice, ("act", "tanh", ("relu", "gelu")), ValueError, "act: expected one of"),
        (checks.choice, ("act", None, ("relu", "gelu")), TypeError, "act: expected one of"),
    ],
)
def test_mistakes_raise_the_documented_type_naming_the_argument(fn, args, exc, words):
    with pytest.raises(exc) as info:
        fn(*args)
    assert str(info.value).startswith(args[0] + ":") and words in str(info.value)


@pytest.mark.parametrize("x", [1, 7, 2**62, np.int64(5), np.int32(1)])
def test_valid_ints_are_returned_as_python_ints(x):
    got = checks.positive_int("n", x)
    assert got == int(x) and type(got) is int


def test_accepted_values_of_the_other_checks():
    assert checks.nonnegative_int("k", 0) == 0
    assert checks.integer("i", 4, 0, 4) == 4 and checks.integer("i", -9, None, None) == -9
    assert checks.probability("p", 0) == 0.0 and checks.probability("p", 1.0, allow_one=True) == 1
    assert checks.flag("f", np.bool_(True)) is True
    assert checks.choice("a", "gelu", ("relu", "gelu")) == "gelu"
    assert checks.show("x" * 200).endswith("...") and len(checks.show("x" * 200)) == 80
