"""The :class:`Mask` base class, block classes, bounded LRU caches and the block helpers every
mask kind shares (see :mod:`attnkit.masks` for the conventions and the shape legend)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Literal

import torch
from torch import Tensor

from attnkit import checks

EMPTY, PARTIAL, FULL = 0, 1, 2
"""Block classes returned by :meth:`Mask.block_map` (int8 values)."""

Alignment = Literal["top_left", "bottom_right"]
ALIGNMENTS = ("top_left", "bottom_right")

BLOCK_MAP_CACHE_SIZE = 16
"""Shapes whose block maps are kept per mask object (least recently used dropped first)."""

PLAN_CACHE_SIZE = 64
"""Kernel plans kept per mask object (least recently used dropped first)."""

_EVAL_ELEMENTS = 2**22
"""Most mask entries evaluated at once when a block map needs exact evaluation."""


class LRUCache(OrderedDict):
    """A bounded, named least-recently-used cache (a dict that drops its oldest entries).

    ``get(key)`` and ``put(key, value)`` (or ``cache[key] = value``) mark the key as recently
    used; once more than ``maxsize`` entries are held, the least recently used is dropped.
    """

    def __init__(self, name: str = "cache", maxsize: int = 16) -> None:
        super().__init__()
        self.name = name
        self.maxsize = checks.positive_int("maxsize", maxsize)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value for ``key`` (now the most recently used), or ``default``."""
        try:
            self.move_to_end(key)
        except KeyError:
            return default
        return super().__getitem__(key)

    def put(self, key: Hashable, value: Any) -> Any:
        """Store ``value`` under ``key``, drop the oldest entries beyond ``maxsize``; ``value``."""
        self[key] = value
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)

    def __repr__(self) -> str:
        return f"LRUCache({self.name!r}, {len(self)}/{self.maxsize} entries)"


def check_alignment(alignment: object) -> str:
    """``alignment`` if it is "top_left" or "bottom_right" (TypeError / ValueError otherwise)."""
    return checks.choice("alignment", alignment, ALIGNMENTS)


def offset(alignment: str | None, q_len: int, kv_len: int) -> int:
    """Shift added to a query index so that it lines up with key indices (Lk - Lq when
    bottom-right aligned, else 0)."""
    return kv_len - q_len if alignment == "bottom_right" else 0


def block_edges(n: int, block: int) -> tuple[Tensor, Tensor]:
    """First and last index (inclusive) of every block of ``range(n)``: two (n_blocks,) tensors."""
    starts = torch.arange(0, n, block)
    ends = torch.clamp(starts + block, max=n) - 1
    return starts, ends


def classify(all_in: Tensor, any_in: Tensor) -> Tensor:
    """Block classes (int8) from 'every entry allowed' / 'some entry allowed' booleans."""
    all_in, any_in = torch.broadcast_tensors(all_in, any_in)
    out = torch.full(all_in.shape, PARTIAL, dtype=torch.int8)
    out[~any_in] = EMPTY
    out[all_in] = FULL
    return out


def classify_tile(t: Tensor, block_q: int, block_kv: int) -> Tensor:
    """Block classes of an evaluated tile ``(..., n, m)`` bool cut into blocks from its top-left
    corner (the last block in each direction may be shorter): int8 (..., ceil(n/bq), ceil(m/bk))."""
    n, m = t.shape[-2:]
    pq, pk = -n % block_q, -m % block_kv
    # padding must not change the classification: pad with True for 'all', False for 'any'
    all_in = torch.nn.functional.pad(t, (0, pk, 0, pq), value=True) if pq or pk else t
    any_in = torch.nn.functional.pad(t, (0, pk, 0, pq), value=False) if pq or pk else t
    shape = t.shape[:-2] + ((n + pq) // block_q, block_q, (m + pk) // block_kv, block_kv)
    all_b = all_in.reshape(shape).all(-1).all(-2)
    any_b = any_in.reshape(shape).any(-1).any(-2)
    return classify(all_b, any_b)


def check_sizes(q_len: object, kv_len: object) -> tuple[int, int]:
    """Both lengths as positive ints (TypeError / ValueError naming q_len or kv_len)."""
    return checks.positive_int("q_len", q_len), checks.positive_int("kv_len", kv_len)


def saturate(t: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``t`` cast to ``dtype`` with finite values clamped to +-finfo(dtype).max first, so a bias
    too large for ``dtype`` saturates instead of becoming +-inf (policy P5)."""
    if dtype is None:
        return t
    big = torch.finfo(dtype).max
    if t.dtype.is_floating_point and torch.finfo(t.dtype).max > big:
        t = torch.where(torch.isfinite(t), t.clamp(-big, big), t)
    return t.to(dtype)


class Mask:
    """Base class of all masks (True = may attend).

    Subclasses implement :meth:`_allowed` on index grids, and optionally :meth:`_block_map`
    analytically (the default evaluates the mask block row by block row) and :meth:`_bias`.
    """

    batch_shape: tuple[int, ...] = ()
    """Leading batch dims this mask carries (aligned with the leading batch dims of ``q``;
    each is 1 or equal to the input's); () when the mask is the same for every batch element."""

    has_bias: bool = False
    """True when the mask adds float values to the scores (additive masks, ALiBi)."""

    alignment: str | None = None
    """How query indices line up with key indices: "top_left" (query i is position i),
    "bottom_right" (the last query is the last key) or None when the mask does not depend on it
    (key padding, documents, explicit tensors). Combinations report None: see :meth:`leaves`."""

    # --- to implement -------------------------------------------------------------------------
    def _allowed(self, qi: Tensor, kj: Tensor, q_len: int, kv_len: int) -> Tensor:
        """Bool broadcastable to batch_shape + (n, m) for query indices ``qi`` (n, 1) and key
        indices ``kj`` (1, m); its batch dims (if any) are the leading ones of batch_shape."""
        raise NotImplementedError

    def _bias(self, qi: Tensor, kj: Tensor, q_len: int, kv_len: int) -> Tensor | None:
        """Float ([B,] n, m) added to the scores, or None."""
        return None

    def _block_map(self, q_len: int, kv_len: int, block_q: int, block_kv: int) -> Tensor:
        """Exact classes of the *allowed* part (ignoring any bias): int8 broadcastable to
        batch_shape + (nq, nk). The default evaluates the mask in row chunks of blocks."""
        nq = math.ceil(q_len / block_q)
        nk = math.ceil(kv_len / block_kv)
        rows_per_step = max(1, _EVAL_ELEMENTS // max(1, block_q * kv_len * self._batch_numel()))
        parts = []
        for b0 in range(0, nq, rows_per_step):
            q0, q1 = b0 * block_q, min((b0 + rows_per_step) * block_q, q_len)
            t = self.tile(q0, q1, 0, kv_len, q_len, kv_len)
            parts.append(classify_tile(t, block_q, block_kv))
        out = torch.cat(parts, dim=-2)
        assert out.shape[-2:] == (nq, nk)
        return out

    # --- structure ----------------------------------------------------------------------------
    @property
    def parts(self) -> tuple[Mask, ...]:
        """Direct children: (a, b) for an :class:`Intersection` or :class:`Union`, () else."""
        return ()

    def leaves(self) -> tuple[Mask, ...]:
        """Every leaf mask of this combination, left to right (``(self,)`` for a leaf)."""
        if not self.parts:
            return (self,)
        return tuple(leaf for p in self.parts for leaf in p.leaves())

    def as_band(self) -> Any:
        """This mask as one :class:`~attnkit.masks.band.Band` ``lo <= j - (i + offset) <= hi``
        when it is one (causal, sliding windows and intersections of bands with one alignment),
        else None."""
        return None

    _band = as_band  # the name the kernels used before as_band() was public

    @property
    def is_plain_causal(self) -> bool:
        """True only for a top-left :class:`Causal` mask (SDPA's ``is_causal=True``)."""
        return False

    # --- caches -------------------------------------------------------------------------------
    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors the leaves of this mask hold (counts, ids, mask tensors, biases, slopes),
        leaf by leaf."""
        return tuple(
            t for leaf in self.leaves() for t in vars(leaf).values() if isinstance(t, Tensor)
        )

    def data_version(self) -> tuple[int, ...]:
        """The in-place version counters of the tensors the leaves of this mask hold: a change
        (``t[...] = x`` on a tensor given to :func:`from_tensor`, ``key_padding``, ...) means the
        cached block maps and plans describe old data. Inference tensors keep no counter
        (-1): changing one in place inside ``torch.inference_mode`` is not seen."""
        return tuple(-1 if t.is_inference() else t._version for t in self.tensors())

    def _fresh_caches(self) -> None:
        """Drop the block-map and plan caches when a held tensor changed in place since they
        were filled (:meth:`data_version`)."""
        version = self.data_version()
        if self.__dict__.get("_cached_version") != version:
            self.__dict__.pop("_block_map_lru", None)
            self.__dict__.pop("_plan_lru", None)
            self.__dict__["_cached_version"] = version

    @property
    def block_map_cache(self) -> LRUCache:
        """Block maps of this mask per (kind, q_len, kv_len, block_q, block_kv); emptied when a
        tensor the mask holds changes in place."""
        self._fresh_caches()
        cache = self.__dict__.get("_block_map_lru")
        if cache is None:
            cache = self.__dict__["_block_map_lru"] = LRUCache(
                "block maps", 2 * BLOCK_MAP_CACHE_SIZE
            )
        return cache

    @property
    def plan_cache(self) -> LRUCache:
        """Kernel plans for this mask (kernels choose the keys; masks never read it); emptied
        when a tensor the mask holds changes in place."""
        self._fresh_caches()
        cache = self.__dict__.get("_plan_lru")
        if cache is None:
            cache = self.__dict__["_plan_lru"] = LRUCache("kernel plans", PLAN_CACHE_SIZE)
        return cache

    def _cache(self) -> LRUCache:
        """Deprecated name of :attr:`plan_cache` (the kernels' plan cache)."""
        return self.plan_cache

    # --- helpers ------------------------------------------------------------------------------
    def _batch_numel(self) -> int:
        return math.prod(self.batch_shape)

    def _classes(self, q_len: int, kv_len: int, block_q: int, block_kv: int) -> Tensor:
        """Cached exact classes of the allowed part, int8 batch_shape + (nq, nk), contiguous."""
        key = ("allowed", q_len, kv_len, block_q, block_kv)
        cache = self.block_map_cache
        bm = cache.get(key)
        if bm is None:
            nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
            bm = self._block_map(q_len, kv_len, block_q, block_kv)
            bm = cache.put(key, bm.expand(self.batch_shape + (nq, nk)).contiguous())
        return bm

    # --- public API --------------------------------------------------------------------------
    def materialize(self, q_len: int, kv_len: int) -> Tensor:
        """The mask as a bool tensor of shape batch_shape + (Lq, Lk): (Lq, Lk), or (B, Lq, Lk)
        for per-batch masks."""
        q_len, kv_len = check_sizes(q_len, kv_len)
        return self.tile(0, q_len, 0, kv_len, q_len, kv_len)

    def tile(self, q0: int, q1: int, k0: int, k1: int, q_len: int, kv_len: int) -> Tensor:
        """Rows ``q0:q1``, columns ``k0:k1`` of the materialized mask:
        batch_shape + (q1-q0, k1-k0) bool (possibly an expanded view)."""
        qi = torch.arange(q0, q1)[:, None]
        kj = torch.arange(k0, k1)[None, :]
        out = self._allowed(qi, kj, q_len, kv_len)
        return out.expand(self.batch_shape + (q1 - q0, k1 - k0))

    def bias_tile(
        self,
        q0: int,
        q1: int,
        k0: int,
        k1: int,
        q_len: int,
        kv_len: int,
        dtype: torch.dtype | None = None,
    ) -> Tensor | None:
        """Score bias for a tile: batch_shape + (q1-q0, k1-k0) float, or None when there is none.

        With ``dtype``, the bias is cast to it and saturates at +-finfo(dtype).max (policy P5:
        a finite bias never becomes -inf, which would mean "not allowed")."""
        if not self.has_bias:
            return None
        qi = torch.arange(q0, q1)[:, None]
        kj = torch.arange(k0, k1)[None, :]
        b = self._bias(qi, kj, q_len, kv_len)
        if b is None:
            return None
        return saturate(b, dtype).expand(self.batch_shape + (q1 - q0, k1 - k0))

    def materialize_bias(
        self, q_len: int, kv_len: int, dtype: torch.dtype | None = None
    ) -> Tensor | None:
        """The additive bias as a float tensor batch_shape + (Lq, Lk), or None (``dtype``: as in
        :meth:`bias_tile`)."""
        q_len, kv_len = check_sizes(q_len, kv_len)
        return self.bias_tile(0, q_len, 0, kv_len, q_len, kv_len, dtype)

    def block_map(self, q_len: int, kv_len: int, block_q: int, block_kv: int) -> Tensor:
        """Classify every (block_q x block_kv) block: int8 batch_shape + (nq, nk) of
        EMPTY (no entry allowed) / PARTIAL / FULL (every entry allowed).

        Exact, and computed without building the Lq x Lk grid for the structured masks
        (causal, sliding windows, key padding, documents, prefix-LM and their combinations);
        the last block in each direction may be shorter. A block with a score bias is never
        FULL (it needs the bias applied), only PARTIAL or EMPTY. The result is kept in
        :attr:`block_map_cache` (bounded LRU): treat it as read-only.
        """
        q_len, kv_len = check_sizes(q_len, kv_len)
        block_q = checks.positive_int("block_q", block_q)
        block_kv = checks.positive_int("block_kv", block_kv)
        key = ("public", q_len, kv_len, block_q, block_kv)
        cache = self.block_map_cache
        bm = cache.get(key)
        if bm is None:
            bm = self._classes(q_len, kv_len, block_q, block_kv)
            if self.has_bias:
                bm = torch.where(bm == FULL, torch.tensor(PARTIAL, dtype=torch.int8), bm)
            cache.put(key, bm)
        return bm

    def __and__(self, other: Mask) -> Mask:
        from attnkit.masks.combine import Intersection

        return Intersection(self, require_mask(other, "&"))

    def __or__(self, other: Mask) -> Mask:
        from attnkit.masks.combine import Union

        return Union(self, require_mask(other, "|"))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._repr_fields().items())
        return f"{type(self).__name__}({fields})"

    def _repr_fields(self) -> dict:
        return {}


def require_mask(other: object, op: str) -> Mask:
    if not isinstance(other, Mask):
        raise TypeError(f"mask {op} other: expected a Mask, got {type(other).__name__}")
    return other
