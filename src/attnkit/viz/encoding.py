"""How the HTML view stores attention weights: 8 (or 16) bits per entry, per-row scale,
zlib-compressed per head, base64 in the page.

Format (version 1). For each head (layer ``l``, head ``h``; blocks in row-major order
``l * H + h``) one zlib stream (RFC 1950, what the browser's ``DecompressionStream("deflate")``
reads) holding::

    m     (Lq,)      float32 little-endian   the largest weight of each query row
    code  (Lq, Lk)   uint8 (bits=8) or uint16 little-endian (bits=16), row-major

    weight[i, j] ≈ m[i] * code[i, j] / Q,   Q = 2**bits - 1,   code = round(Q * w / m[i])

so every stored weight is within ``m[i] / (2 Q)`` of the true one (half a step of its row;
``m[i] / 510`` with 8 bits), the largest weight of every row is exact to float32, and a weight
below ``m[i] / (2 Q)`` is stored as 0. A row of zeros (a fully masked query) stays all zero.
Per-row scaling keeps the precision where each query's attention is, whatever the other rows do.

After the heads, one more zlib stream holds the overview thumbnails: for every head (same
order) a ``(tq, tk)`` uint8 image, ``tq = min(Lq, 64)``, ``tk = min(Lk, 64)``: the mean weight of
each block of the matrix, as a colour index ``round(255 * sqrt(t / max t))`` (each thumbnail scaled
to its own maximum, square-root scale). ``blocks`` and ``thumbs`` give (offset, length) of each
stream in the concatenated bytes.

Size: zlib shrinks the codes a lot where attention is peaked (most codes are 0); e.g. the default
model's 6 × 12 heads on a 256-token text take about 0.5 byte per entry, base64 adds a third.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["THUMB", "Encoded", "encode", "decode_head", "quantise_rows"]

THUMB = 64
"""Largest side of an overview thumbnail, in cells."""

_LEVEL = 1  # zlib level: 6 is only about 8 % smaller on attention codes, and 3-4 x slower


@dataclass(frozen=True)
class Encoded:
    """The concatenated streams and where each one is: ``blocks[l * H + h] = (offset,
    length)``, ``thumbs = (offset, length)``, ``thumb_shape = (tq, tk)``."""

    data: bytes
    blocks: list[tuple[int, int]]
    thumbs: tuple[int, int]
    thumb_shape: tuple[int, int]


def quantise_rows(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(Lq, Lk) weights in [0, 1] -> (m (Lq,) float32 row maxima, codes (Lq, Lk) uint8/uint16)."""
    q = (1 << bits) - 1
    m = w.max(axis=-1).astype(np.float32)
    inv = np.divide(q, m, out=np.zeros_like(m), where=m > 0)
    codes = np.rint(w * inv[:, None])
    np.clip(codes, 0, q, out=codes)
    return m, codes.astype(np.uint8 if bits == 8 else np.dtype("<u2"))


def _pool(w: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Mean of each block of a (Lq, Lk) matrix cut into rows × cols blocks (near-equal)."""
    r = np.linspace(0, w.shape[0], rows + 1).astype(int)[:-1]
    c = np.linspace(0, w.shape[1], cols + 1).astype(int)[:-1]
    sums = np.add.reduceat(np.add.reduceat(w.astype(np.float64), r, axis=0), c, axis=1)
    counts = np.outer(np.diff(np.append(r, w.shape[0])), np.diff(np.append(c, w.shape[1])))
    return sums / counts


def _thumb(w: np.ndarray, rows: int, cols: int) -> np.ndarray:
    t = _pool(w, rows, cols)
    top = t.max()
    if top <= 0:
        return np.zeros((rows, cols), np.uint8)
    return np.rint(255 * np.sqrt(t / top)).astype(np.uint8)


def encode(weights: np.ndarray, bits: int = 8) -> Encoded:
    """Encode (N, H, Lq, Lk) float32 weights in [0, 1] (see the module docstring)."""
    n, h, lq, lk = weights.shape
    tq, tk = min(lq, THUMB), min(lk, THUMB)
    parts: list[bytes] = []
    blocks: list[tuple[int, int]] = []
    thumbs: list[bytes] = []
    offset = 0
    for layer in range(n):
        for head in range(h):
            w = weights[layer, head]
            m, codes = quantise_rows(w, bits)
            block = zlib.compress(m.astype("<f4").tobytes() + codes.tobytes(), _LEVEL)
            parts.append(block)
            blocks.append((offset, len(block)))
            offset += len(block)
            thumbs.append(_thumb(w, tq, tk).tobytes())
    tblock = zlib.compress(b"".join(thumbs), _LEVEL)
    parts.append(tblock)
    return Encoded(b"".join(parts), blocks, (offset, len(tblock)), (tq, tk))


def decode_head(enc: Encoded, index: int, lq: int, lk: int, bits: int) -> np.ndarray:
    """The stored (Lq, Lk) weights of block ``index`` as float64 (what the page shows)."""
    off, length = enc.blocks[index]
    raw = zlib.decompress(enc.data[off : off + length])
    m = np.frombuffer(raw[: 4 * lq], "<f4").astype(np.float64)
    codes = np.frombuffer(raw[4 * lq :], np.uint8 if bits == 8 else "<u2").reshape(lq, lk)
    return m[:, None] * codes / ((1 << bits) - 1)
