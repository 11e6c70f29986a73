"""The numbers the seeds print, as data: each :class:`PrintedValue` holds the value as printed,
the exact seed text it is read from (found again in the seed file at run time), and which
computed values to put next to it. Also the seeds' worked-example inputs.

Agreement with a printed value: the seed prints ``digits`` decimals, so a computed value agrees
when ``|computed - printed| <= 0.5 * 10**-digits`` (+1e-12); an exact printed value (such as
1/√2) must agree within 1e-12.

* seed 004 (additive vs dot-product attention): ``SEED004_Q``, ``SEED004_K``, ``SEED004_V``; the
  seed's own printed intermediates (re-used to re-check its later arithmetic); ``SEED004_VALUES``.
* seed 002 (the softmax example): ``SEED002_SCORES``; ``SEED002_VALUES``.

The computation and the comparison are in :mod:`attnkit.explain.seed_examples`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "SEED002_SCORES",
    "SEED002_SNIPPET",
    "SEED002_VALUES",
    "SEED004_ADDITIVE_E",
    "SEED004_ADDITIVE_WEIGHTS",
    "SEED004_DOT_WEIGHTS",
    "SEED004_K",
    "SEED004_Q",
    "SEED004_V",
    "SEED004_VALUES",
    "PrintedValue",
]


@dataclass(frozen=True)
class PrintedValue:
    """One number a seed prints. ``snippet`` is the exact seed text it is read from.

    ``digits``: decimals printed (tolerance 0.5 * 10**-digits), or None for an exact value
    (tolerance 1e-12). ``compare``: (column label, case, field, index) — which computed values
    to put next to it; ``case`` names an entry of the example's computed cases.
    """

    key: str
    section: str
    label: str
    printed: str
    value: float
    digits: int | None
    snippet: str
    compare: tuple[tuple[str, str, str, tuple[int, ...]], ...]

    @property
    def tolerance(self) -> float:
        return 1e-12 if self.digits is None else 0.5 * 10.0**-self.digits + 1e-12


# section titles and column labels (which computation a value comes from)
_ADD = "additive, W_q = W_k = I, v = [1, 1]"
_DOT = "dot-product, d_k = 2"
_LIB = "library"
_LIB_S = "library, ÷√d_k"
_LIB_U = "library, unscaled"
_OWN = "from the tutorial's numbers"


# --- seed 004 --------------------------------------------------------------------------------
SEED004_Q = [[1.0, 0.0], [0.0, 1.0]]
SEED004_K = [[1.0, 2.0], [3.0, 4.0]]
SEED004_V = [[5.0, 6.0], [7.0, 8.0]]
# the seed's own printed intermediates, used to re-check its later arithmetic
SEED004_ADDITIVE_E = [1.0, 0.999]
SEED004_ADDITIVE_WEIGHTS = [0.5001, 0.4999]
SEED004_DOT_WEIGHTS = [0.1192, 0.8808]

SEED004_VALUES = (
    PrintedValue(
        "additive.e11", _ADD, "e11", "1", 1.0, 0,
        r"\begin{bmatrix} 1 & 0 \\ 0 & 1 \end{bmatrix} \begin{bmatrix} 1 \\ 2 \end{bmatrix}"
        r"\right) = 1",
        ((_LIB, "additive", "scores", (0, 0)),),
    ),
    PrintedValue(
        "additive.e12", _ADD, "e12", "0.999", 0.999, 3,
        r"\tanh\left(\begin{bmatrix} 4 \\ 4 \end{bmatrix}\right) \approx 0.999",
        ((_LIB, "additive", "scores", (0, 1)),),
    ),
    PrintedValue(
        "additive.alpha11", _ADD, "α11", "0.5001", 0.5001, 4,
        r"\alpha_{11} = \frac{\exp(1)}{\exp(1) + \exp(0.999)} \approx 0.5001",
        ((_LIB, "additive", "weights", (0, 0)), (_OWN, "seed_additive", "weights", (0, 0))),
    ),
    PrintedValue(
        "additive.alpha12", _ADD, "α12", "0.4999", 0.4999, 4,
        r"\alpha_{12} = \frac{\exp(0.999)}{\exp(1) + \exp(0.999)} \approx 0.4999",
        ((_LIB, "additive", "weights", (0, 1)), (_OWN, "seed_additive", "weights", (0, 1))),
    ),
    PrintedValue(
        "additive.out11", _ADD, "Attention(Q1)[1]", "6", 6.0, 0,
        r"\approx \begin{bmatrix} 6 & 7 \end{bmatrix}",
        ((_LIB, "additive", "output", (0, 0)), (_OWN, "seed_additive", "output", (0, 0))),
    ),
    PrintedValue(
        "additive.out12", _ADD, "Attention(Q1)[2]", "7", 7.0, 0,
        r"\approx \begin{bmatrix} 6 & 7 \end{bmatrix}",
        ((_LIB, "additive", "output", (0, 1)), (_OWN, "seed_additive", "output", (0, 1))),
    ),
    PrintedValue(
        "dot.e11", _DOT, "e11", "1/√2", 1.0 / math.sqrt(2.0), None,
        r"e_{11} = \frac{1 \cdot 1 + 0 \cdot 2}{\sqrt{2}} = \frac{1}{\sqrt{2}}",
        ((_LIB_S, "scaled", "scaled", (0, 0)), (_LIB_U, "unscaled", "scaled", (0, 0))),
    ),
    PrintedValue(
        "dot.e12", _DOT, "e12", "3/√2", 3.0 / math.sqrt(2.0), None,
        r"e_{12} = \frac{1 \cdot 3 + 0 \cdot 4}{\sqrt{2}} = \frac{3}{\sqrt{2}}",
        ((_LIB_S, "scaled", "scaled", (0, 1)), (_LIB_U, "unscaled", "scaled", (0, 1))),
    ),
    PrintedValue(
        "dot.alpha11", _DOT, "α11", "0.1192", 0.1192, 4,
        r"\exp(\frac{3}{\sqrt{2}})} \approx 0.1192",
        ((_LIB_S, "scaled", "weights", (0, 0)), (_LIB_U, "unscaled", "weights", (0, 0))),
    ),
    PrintedValue(
        "dot.alpha12", _DOT, "α12", "0.8808", 0.8808, 4,
        r"\exp(\frac{3}{\sqrt{2}})} \approx 0.8808",
        ((_LIB_S, "scaled", "weights", (0, 1)), (_LIB_U, "unscaled", "weights", (0, 1))),
    ),
    PrintedValue(
        "dot.out11", _DOT, "Attention(Q1)[1]", "6.7624", 6.7624, 4,
        r"\approx \begin{bmatrix} 6.7624 & 7.7624 \end{bmatrix}",
        (
            (_LIB_S, "scaled", "output", (0, 0)),
            (_LIB_U, "unscaled", "output", (0, 0)),
            (_OWN, "seed_dot", "output", (0, 0)),
        ),
    ),
    PrintedValue(
        "dot.out12", _DOT, "Attention(Q1)[2]", "7.7624", 7.7624, 4,
        r"\approx \begin{bmatrix} 6.7624 & 7.7624 \end{bmatrix}",
        (
            (_LIB_S, "scaled", "output", (0, 1)),
            (_LIB_U, "unscaled", "output", (0, 1)),
            (_OWN, "seed_dot", "output", (0, 1)),
        ),
    ),
)  # fmt: skip


# --- seed 002 --------------------------------------------------------------------------------
SEED002_SCORES = [2.0, 1.0, 0.1]
SEED002_SNIPPET = "假设三个位置的分数为[2.0, 1.0, 0.1],经过softmax后变为[0.65, 0.24, 0.11]"

_SM = "softmax([2.0, 1.0, 0.1])"
SEED002_VALUES = tuple(
    PrintedValue(
        f"softmax.{i}", _SM, f"softmax[{i}]", text, float(text), 2, SEED002_SNIPPET,
        ((_LIB, "softmax", "weights", (0, i)),),
    )
    for i, text in enumerate(["0.65", "0.24", "0.11"])
)  # fmt: skip
