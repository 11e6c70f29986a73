"""Masks as tiles: the form in which the fused additive kernels read a mask.

The mask is classified per (block_q x block_k) tile (``additive_block_q`` / ``additive_block_k``
of the tuning in use, :mod:`attnkit.kernels.tuning`; the kernels read the tile from the packed
tiles' shape) by its block map: EMPTY tiles are skipped,
FULL tiles need no mask, and only PARTIAL tiles are evaluated (``mask.tile``, a few query blocks
at a time) and packed as bool tiles. The full Lq x Lk grid is never built unless every tile is
partial (then the mask holds that much information anyway).

Shape legend: ``BH`` flattened batch dims, ``MB`` flattened batch dims of the mask, ``nq``/``nk``
numbers of query / key blocks, ``T`` number of packed tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.call.memo import MemoKey
from attnkit.kernels.tuning import DEFAULT, current
from attnkit.masks import FULL, PARTIAL

BLOCK_Q = DEFAULT.additive_block_q
"""Built-in default of the query rows per work unit and per mask tile (a multiple of 4)."""
BLOCK_K = DEFAULT.additive_block_k
"""Built-in default of the keys per block (inner loops run over these, contiguous in memory)."""
TILE_EVAL_ELEMENTS = 2**22
"""Most mask entries evaluated by one ``mask.tile`` call while packing partial tiles."""


@dataclass(frozen=True)
class MaskTiles:
    """A mask in the form the kernels read.

    mask_index: (BH,) int64, the mask batch element of each flattened batch element.
    classes: (MB, nq, nk) int8 EMPTY / PARTIAL / FULL per (BQ x BK) tile.
    tile_id: (MB, nq, nk) int32 index into ``tiles`` of each PARTIAL tile, -1 elsewhere.
    tiles: (T, BQ, BK) uint8, 1 = may attend (padded with 0 past Lq / Lk); T >= 1. BQ (a
    multiple of 4) and BK are the tile, which the kernels read from this shape.
    """

    mask_index: np.ndarray
    classes: np.ndarray
    tile_id: np.ndarray
    tiles: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(mask_index, classes, tile_id, tiles), the kernels' mask arguments."""
        return self.mask_index, self.classes, self.tile_id, self.tiles


@dataclass(frozen=True)
class TilesKey(MemoKey[MaskTiles]):
    """A call's :class:`MaskTiles` in (block_q x block_k) tiles, in the call's memo."""

    block_q: int
    block_k: int


def mask_tiles(call: AttentionCall) -> MaskTiles:
    """Tile classes and packed partial tiles of ``call.mask`` (kept in the call's memo), in the
    tile of the tuning in use."""
    t = current()
    bq, bk = t.additive_block_q, t.additive_block_k
    return call.memo.get(TilesKey(bq, bk), lambda: _build(call, bq, bk))


def _build(call: AttentionCall, BLOCK_Q: int, BLOCK_K: int) -> MaskTiles:  # noqa: N803
    lq, lk = call.q_len, call.kv_len
    nq, nk = -(-lq // BLOCK_Q), -(-lk // BLOCK_K)
    batch = call.batch_shape
    mask = call.mask
    if mask is None:
        return MaskTiles(
            np.zeros(math.prod(batch), np.int64),
            np.full((1, nq, nk), FULL, np.int8),
            np.full((1, nq, nk), -1, np.int32),
            np.zeros((1, BLOCK_Q, BLOCK_K), np.uint8),
        )
    mshape = tuple(mask.batch_shape)
    mb = math.prod(mshape)
    index = torch.arange(mb).reshape(mshape + (1,) * (len(batch) - len(mshape)))
    index = index.expand(batch).reshape(-1)
    classes = call.block_map(BLOCK_Q, BLOCK_K).reshape(mb, nq, nk)
    partial = classes == PARTIAL
    tile_id = torch.full((mb, nq, nk), -1, dtype=torch.int32)
    pieces = [torch.zeros((1, BLOCK_Q, BLOCK_K), dtype=torch.uint8)]  # tile 0: unused filler
    count = 1
    step = max(1, TILE_EVAL_ELEMENTS // (mb * BLOCK_Q * nk * BLOCK_K))  # query blocks per call
    for qb0 in range(0, nq, step):
        qb1 = min(nq, qb0 + step)
        sel = partial[:, qb0:qb1]
        cols = sel.any(0).any(0).nonzero()
        if cols.numel() == 0:
            continue
        kb0, kb1 = int(cols[0]), int(cols[-1]) + 1
        sel = sel[:, :, kb0:kb1]
        q0, q1 = qb0 * BLOCK_Q, min(lq, qb1 * BLOCK_Q)
        k0, k1 = kb0 * BLOCK_K, min(lk, kb1 * BLOCK_K)
        t = mask.tile(q0, q1, k0, k1, lq, lk).reshape(mb, q1 - q0, k1 - k0)
        pad_q, pad_k = (qb1 - qb0) * BLOCK_Q - (q1 - q0), (kb1 - kb0) * BLOCK_K - (k1 - k0)
        t = torch.nn.functional.pad(t.to(torch.uint8), (0, pad_k, 0, pad_q))
        t = t.reshape(mb, qb1 - qb0, BLOCK_Q, kb1 - kb0, BLOCK_K).permute(0, 1, 3, 2, 4)
        chosen = t[sel]  # (n, BLOCK_Q, BLOCK_K), row-major order of sel
        n = chosen.shape[0]
        tile_id[:, qb0:qb1, kb0:kb1][sel] = torch.arange(count, count + n, dtype=torch.int32)
        pieces.append(chosen)
        count += n
    return MaskTiles(
        index.numpy().astype(np.int64),
        np.ascontiguousarray(classes.numpy().astype(np.int8)),
        tile_id.numpy(),
        np.ascontiguousarray(torch.cat(pieces).numpy()),
    )
