"""Which cached keys a decode step's mask lets its queries see: a key range and the allowed tile.

A decode step has few query rows (Lq <= 16) against a long cache, so the mask is evaluated on the
(Lq, n) tile of the keys it can allow, never on the full (Lq, Lk) grid:

- :func:`key_range` bounds the allowed keys from the mask's structure: a band
  (causal / sliding window, either alignment) allows keys ``i + offset + lo .. i + offset + hi``
  of row ``i``; key padding ``j < max(lengths)``; an intersection the overlap of its parts' ranges;
  a union their hull; anything else every key. Keys outside the range are never read.
- :func:`allowed_tile` gives the mask on the rows x range, or None when every entry is allowed
  (a band that covers the whole range in every row, e.g. bottom-right causal with one query).

Shape legend: ``mb`` the mask's batch dims, ``Lq``/``Lk`` query/key lengths, ``n`` keys in range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from attnkit.masks import Mask
from attnkit.masks.band import Band
from attnkit.masks.base import Intersection, Union
from attnkit.masks.indexed import KeyPadding

__all__ = ["KeyRange", "allowed_tile", "key_range"]


@dataclass(frozen=True)
class KeyRange:
    """Keys ``start .. stop - 1`` hold every key the mask allows (``start >= stop``: none);
    ``full`` is True when every row allows every key of the range (no mask to apply)."""

    start: int
    stop: int
    full: bool

    @property
    def empty(self) -> bool:
        return self.start >= self.stop


def _band_range(band: Band, q_len: int, kv_len: int) -> KeyRange:
    off = band.offset(q_len, kv_len)
    lo = 0 if band.lo == -math.inf else off + band.lo  # row 0's first key
    hi = kv_len - 1 if band.hi == math.inf else q_len - 1 + off + band.hi  # last row's last key
    start, stop = max(0, int(max(lo, -1))), min(kv_len, int(min(hi, kv_len)) + 1)
    # every row allows the whole range when the last row's first key and row 0's last key do
    first_last = -math.inf if band.lo == -math.inf else q_len - 1 + off + band.lo
    last_first = math.inf if band.hi == math.inf else off + band.hi
    return KeyRange(start, stop, first_last <= start and last_first >= stop - 1)


def key_range(mask: Mask | None, q_len: int, kv_len: int) -> KeyRange:
    """The :class:`KeyRange` of ``mask`` for ``q_len`` queries against ``kv_len`` keys."""
    if mask is None:
        return KeyRange(0, kv_len, True)
    band = mask.as_band()
    if isinstance(band, Band):
        return _band_range(band, q_len, kv_len)
    if isinstance(mask, KeyPadding):
        stop = min(kv_len, int(mask.lengths.max()))
        return KeyRange(0, stop, bool((mask.lengths >= stop).all()))
    if isinstance(mask, Intersection):
        a, b = (key_range(p, q_len, kv_len) for p in mask.parts)
        return KeyRange(max(a.start, b.start), min(a.stop, b.stop), a.full and b.full)
    if isinstance(mask, Union):
        a, b = (key_range(p, q_len, kv_len) for p in mask.parts)
        return KeyRange(min(a.start, b.start), max(a.stop, b.stop), False)
    return KeyRange(0, kv_len, False)


def allowed_tile(mask: Mask | None, keys: KeyRange, q_len: int, kv_len: int) -> Tensor | None:
    """Bool mb + (Lq, n) of the allowed entries in the range, or None when all are allowed."""
    if mask is None or keys.full:
        return None
    return mask.tile(0, q_len, keys.start, keys.stop, q_len, kv_len)
