"""Independent references for mask tests: block classes by an explicit loop over blocks, and
index grids (NumPy only, never attnkit's own code paths)."""

from __future__ import annotations

import numpy as np

EMPTY, PARTIAL, FULL = 0, 1, 2


def np_block_classes(grid: np.ndarray, bq: int, bk: int) -> np.ndarray:
    """Reference block classes by an explicit loop over blocks of a (..., Lq, Lk) bool grid."""
    lq, lk = grid.shape[-2:]
    nq, nk = -(-lq // bq), -(-lk // bk)
    out = np.empty(grid.shape[:-2] + (nq, nk), dtype=np.int8)
    for a in range(nq):
        for b in range(nk):
            blk = grid[..., a * bq : (a + 1) * bq, b * bk : (b + 1) * bk]
            out[..., a, b] = np.where(
                blk.all(axis=(-1, -2)), FULL, np.where(blk.any(axis=(-1, -2)), PARTIAL, EMPTY)
            )
    return out


def ij(lq: int, lk: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(lq)[:, None], np.arange(lk)[None, :]
