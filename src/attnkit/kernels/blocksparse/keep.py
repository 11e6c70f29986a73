"""The dropout keep mask of the ``blocksparse`` backend: a counter-based hash, no stored state.

Whether attention weight (batch-head ``bh``, query ``i``, key ``j``) survives dropout is a pure
function of (seed, bh, i, j), so the forward and the backward regenerate exactly the same mask
tile by tile (as FlashAttention derives its mask from (seed, offset)), and a float64 reference
can regenerate it densely (:func:`attnkit.reference.dropout.keep_mask`, written separately in
NumPy). ``bh`` is the flat index over q's batch dims (..., H) in row-major order (query heads,
also for grouped-query calls), ``i`` and ``j`` are positions in the whole sequences.

The hash, in uint64 arithmetic (mod 2**64, logical shifts), with mix = splitmix64's finaliser::

    mix(z)   = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
               z ^ (z >> 31)
    row      = mix(mix(seed + (bh + 1) * 0x9E3779B97F4A7C15) + (i + 1) * 0x9E3779B97F4A7C15)
    u        = mix(row + (j // 4 + 1) * 0xD1B54A32D192ED03)
    word     = (u >> (16 * (j % 4))) & 0xFFFF
    keep     = word >= round(p * 2**16)

one 64-bit hash per row and group of 4 keys, a 16-bit word per key, so an entry is kept with
probability 1 - round(p * 2**16) / 2**16 (p resolved to 2**-16; FlashAttention resolves it to
8 bits). Torch has no uint64 arithmetic: int64 ops wrap identically and logical shifts are masked
arithmetic shifts; the words are read as an int16 view of the hashes (little-endian: word
j % 4 = 0 is the lowest), compared as unsigned through a flip of the sign bit.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

KEEP_BITS = 16
"""Bits of the hash compared with the threshold: p is resolved to 2**-16."""

_GOLDEN = 0x9E3779B97F4A7C15
_COL = 0xD1B54A32D192ED03
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_WORDS = 4
"""Keys per 64-bit hash."""


def _i64(c: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bits."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: Tensor) -> Tensor:
    """splitmix64's finaliser on int64 bits."""
    z = (z ^ _shr(z, 30)) * _i64(_M1)
    z = (z ^ _shr(z, 27)) * _i64(_M2)
    return z ^ _shr(z, 31)


def threshold(p: float) -> int:
    """The integer threshold of dropout probability ``p``: keep when the key's 16-bit word is
    at least this."""
    return round(p * (1 << KEEP_BITS))


def draw_seed(generator: torch.Generator | None = None) -> int:
    """One seed per call from torch's default generator (so ``torch.manual_seed`` and a
    restored RNG state reproduce the masks): an int in [0, 2**62)."""
    return int(torch.randint(0, 1 << 62, (), generator=generator))


def row_keys(seed: int, bh: Tensor, i: Tensor) -> Tensor:
    """The per-row part of the hash: int64 ``row`` for batch-heads ``bh`` and queries ``i``
    (int64 tensors broadcasting to the row shape)."""
    z = _mix(torch.full((), _i64(seed % (1 << 64)), dtype=torch.int64) + (bh + 1) * _i64(_GOLDEN))
    return _mix(z + (i + 1) * _i64(_GOLDEN))


def drop_tile(rows: Tensor, lo: int, hi: int, thresh: int, shift: Tensor | None = None) -> Tensor:
    """Bool *drop* mask (True = dropped): ``rows`` (..., n, 1) from :func:`row_keys`, keys
    lo:hi -> (..., n, hi - lo). ``shift`` (int64, broadcasting to (..., 1, 1)) moves the keys of
    some batch entries by ``4 * shift`` (blocks of a band, each against its own window)."""
    if thresh >= 1 << KEEP_BITS:  # p rounds to 1: every weight dropped (the int16 compare
        lead = rows.shape if shift is None else torch.broadcast_shapes(rows.shape, shift.shape)
        return torch.ones(lead[:-1] + (hi - lo,), dtype=torch.bool, device=rows.device)  # wraps)
    g0, g1 = lo // _WORDS, (hi - 1) // _WORDS + 1
    groups = torch.arange(g0 + 1, g1 + 1)
    if shift is not None:
        groups = groups + shift
    u = _mix(rows + groups * _i64(_COL))  # (..., n, groups)
    if sys.byteorder == "little":
        words = u.view(torch.int16) ^ -(1 << 15)  # signed order = unsigned order of the words
    else:  # pragma: no cover - every supported CPU is little-endian
        shifts = torch.arange(_WORDS) * 16
        words = ((u[..., None] >> shifts) & 0xFFFF).flatten(-2) - (1 << 15)
    a = lo - g0 * _WORDS
    return words[..., a : a + hi - lo] < thresh - (1 << 15)
