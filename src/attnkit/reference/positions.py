"""Sinusoidal position encoding (seed 003; Vaswani et al.)."""

from __future__ import annotations

import numpy as np

from attnkit import checks
from attnkit.reference.traces import PositionsTrace

__all__ = ["sinusoidal_positions"]


def sinusoidal_positions(n: int, d: int) -> PositionsTrace:
    """Sinusoidal position encoding (seed 003; Vaswani et al.).

    PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) for
    pos = 0 .. n-1. Column c uses i = c // 2, so for odd d the last column is a sine.

    Args:
        n: number of positions (>= 1); d: encoding width (>= 1).
    Returns:
        :class:`PositionsTrace`; ``output`` (n, d).
    """
    n = checks.positive_int("n", n)
    d = checks.positive_int("d", d)
    positions = np.arange(n, dtype=np.float64)
    columns = np.arange(d)
    exponents = 2 * (columns // 2) / d  # 2i/d for column 2i and 2i+1
    angles = positions[:, None] / np.power(10000.0, exponents)[None, :]
    output = np.where(columns % 2 == 0, np.sin(angles), np.cos(angles))
    return PositionsTrace(positions=positions, exponents=exponents, angles=angles, output=output)
