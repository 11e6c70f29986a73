"""Band masks: allowed iff ``lo <= j - (i + offset) <= hi``. Causal masks, sliding windows and
their intersections are all bands, so their block maps come from the block corners."""

from __future__ import annotations

import math

import torch

from attnkit import checks
from attnkit.masks.base import Mask
from attnkit.masks.blocks import Alignment, block_edges, check_alignment, classify, offset

__all__ = ["Band", "Causal", "SlidingWindow"]


class Band(Mask):
    """Query ``i`` may attend to key ``j`` iff ``lo <= j - (i + offset) <= hi``, where
    ``offset`` is 0 (``alignment="top_left"``) or Lk - Lq (``"bottom_right"``).

    ``lo`` and ``hi`` are ints, or -inf / +inf for an open side. Structural view of
    :class:`Causal` (lo = -inf, hi = 0) and :class:`SlidingWindow` (lo = -left, hi = right):
    :meth:`Mask.as_band` returns one. ``Band(-1, 0, "top_left")`` on 3 x 3::

        1 0 0
        1 1 0
        0 1 1
    """

    def __init__(self, lo: float, hi: float, alignment: Alignment = "top_left") -> None:
        what = "an int in [-2**62, 2**62] or +-inf"
        lo, hi = (
            x
            if x in (-math.inf, math.inf)
            else checks.integer(n, x, -checks.MAX_INT, checks.MAX_INT, what)
            for n, x in (("lo", lo), ("hi", hi))
        )
        self.lo, self.hi = lo, hi
        self.alignment = check_alignment(alignment)

    def as_band(self) -> Band:
        return self

    def intersect(self, other: Band) -> Band | None:
        """The band both this one and ``other`` allow (None when their alignments differ)."""
        if other.alignment != self.alignment:
            return None
        return Band(max(self.lo, other.lo), min(self.hi, other.hi), self.alignment)

    _band = as_band

    def offset(self, q_len: int, kv_len: int) -> int:
        """Shift added to query indices before comparing with key indices."""
        return offset(self.alignment, q_len, kv_len)

    def _allowed(self, qi, kj, q_len, kv_len):
        d = kj - (qi + offset(self.alignment, q_len, kv_len))
        out = torch.ones(d.shape, dtype=torch.bool, device="cpu")
        if self.lo != -math.inf:
            out &= d >= self.lo
        if self.hi != math.inf:
            out &= d <= self.hi
        return out

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        qs, qe = block_edges(q_len, block_q)
        ks, ke = block_edges(kv_len, block_kv)
        off = offset(self.alignment, q_len, kv_len)
        qs, qe = (qs + off)[:, None], (qe + off)[:, None]
        ks, ke = ks[None, :], ke[None, :]
        dmin = ks - qe  # smallest j - i in the block (every value up to dmax occurs)
        dmax = ke - qs  # largest j - i in the block
        any_in = (dmax >= self.lo) & (dmin <= self.hi)
        all_in = (dmin >= self.lo) & (dmax <= self.hi)
        return classify(all_in, any_in)

    def _repr_fields(self):
        return {"lo": self.lo, "hi": self.hi, "alignment": self.alignment}


class Causal(Band):
    """Causal mask: query ``i`` may attend to keys ``j <= i`` (after alignment).

    ``alignment="top_left"`` aligns the first query with the first key (SDPA's ``is_causal``,
    PyTorch's ``causal_upper_left``); ``"bottom_right"`` aligns the last query with the last key
    (``causal_lower_right``: decoding with a KV cache, Lq < Lk). For Lq = 3, Lk = 5::

        top_left        bottom_right
        1 0 0 0 0       1 1 1 0 0
        1 1 0 0 0       1 1 1 1 0
        1 1 1 0 0       1 1 1 1 1

    With Lq > Lk, bottom-right alignment leaves the first Lq - Lk rows without any key (they
    give output 0). ``causal`` is the same class.
    """

    def __init__(self, alignment: Alignment = "top_left") -> None:
        super().__init__(-math.inf, 0, alignment)

    @property
    def is_plain_causal(self) -> bool:
        return self.alignment == "top_left"

    def _repr_fields(self):
        return {"alignment": self.alignment}


class SlidingWindow(Band):
    """Sliding window: query ``i`` may attend to keys ``i - left <= j <= i + right`` (after
    alignment, as in :class:`Causal`).

    ``right`` defaults to ``left`` (symmetric window); ``sliding_window(w) & causal()`` (or
    ``sliding_window(w, 0)``) gives a local-causal mask (with a KV cache use
    ``alignment="bottom_right"``). ``left`` and ``right`` are ints in [0, 2**62]; a window
    wider than the sequence allows every key. ``sliding_window(1)`` and ``sliding_window(2, 0)``
    on 5 x 5::

        sliding_window(1)   sliding_window(2, 0)
        1 1 0 0 0           1 0 0 0 0
        1 1 1 0 0           1 1 0 0 0
        0 1 1 1 0           1 1 1 0 0
        0 0 1 1 1           0 1 1 1 0
        0 0 0 1 1           0 0 1 1 1
    """

    def __init__(
        self, left: int, right: int | None = None, alignment: Alignment = "top_left"
    ) -> None:
        left = checks.nonnegative_int("left", left)
        right = left if right is None else checks.nonnegative_int("right", right)
        super().__init__(-left, right, alignment)
        self.left, self.right = left, right

    def _repr_fields(self):
        return {"left": self.left, "right": self.right, "alignment": self.alignment}
