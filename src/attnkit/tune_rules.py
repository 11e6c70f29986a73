"""The decision rules of ``attnkit tune``: from measured points (a size, a speed ratio) to the
value a :class:`~attnkit.kernels.tuning.Tuning` field takes, without timing anything (so they
are tested on injected points, :mod:`attnkit.autotune` does the measuring)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["element_threshold", "split_k_threshold"]


def element_threshold(points: Sequence[tuple[float, float]], margin: float) -> int:
    """``blocksparse_element_call_entries`` from measured points (skipped score entries per
    per-element SDPA call, dense time / blocksparse time), without timing anything.

    Per-element calls must beat dense by ``margin`` at every measured size from the threshold
    up. When they do at every size, the threshold is the smallest measured one (nothing below
    it was measured, so smaller calls keep dense); when they lose at the largest size, it is
    4x that size (auto keeps dense on every measured size); otherwise the crossover lies
    between the largest losing size and the next (winning) one, and the threshold is their
    geometric mean."""
    if not points:
        raise ValueError("points: expected at least one (entries per call, ratio), got none")
    pts = sorted((float(e), float(r)) for e, r in points)
    first = len(pts)
    while first > 0 and pts[first - 1][1] >= margin:
        first -= 1
    if first == len(pts):
        return int(min(2**40, 4 * pts[-1][0]))
    if first == 0:
        return max(1, math.ceil(pts[0][0]))
    return max(1, math.ceil(math.sqrt(pts[first - 1][0] * pts[first][0])))


def split_k_threshold(points: Sequence[tuple[int, float]], margin: float) -> int:
    """``decode_split_k_min_bytes`` from measured points (k and v bytes, torch-ops time /
    split-K time), without timing anything: the least size at which the kernel wins by
    ``margin`` and from which it never loses by ``margin`` (ties keep it); 2**40 (never) when
    there is no such size."""
    least = None
    for size, ratio in sorted(points):
        if ratio >= margin and least is None:
            least = int(size)
        elif ratio * margin < 1.0:
            least = None  # clearly slower at a larger size: not from here
    return least if least is not None else 2**40
