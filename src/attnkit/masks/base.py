"""The :class:`Mask` base class and its combinations :class:`Intersection` (``a & b``, both
allow; biases add) and :class:`Union` (``a | b``, either allows; refused for masks with a score
bias), which its operators build. The shared vocabulary (block classes, alignments, caches,
block helpers) is :mod:`attnkit.masks.blocks` (see :mod:`attnkit.masks` for
the conventions and the shape legend)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from attnkit import checks
from attnkit.masks.blocks import (
    BLOCK_MAP_CACHE_SIZE,
    EMPTY,
    EVAL_ELEMENTS,
    FULL,
    PARTIAL,
    PLAN_CACHE_SIZE,
    LRUCache,
    check_sizes,
    classify,
    classify_tile,
    common_batch,
    lift_batch,
    refine,
    saturate,
)
from attnkit.tensor_version import version

__all__ = ["Intersection", "Mask", "Union", "require_mask"]


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
        rows_per_step = max(1, EVAL_ELEMENTS // max(1, block_q * kv_len * self._batch_numel()))
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

    def bias_tensors(self) -> tuple[Tensor, ...]:
        """The floating tensors (additive biases) its biased leaves hold, leaf by leaf: what a
        bias gradient flows into, and what the overflow policy reads of a bias."""
        return tuple(
            t
            for leaf in self.leaves()
            if leaf.has_bias
            for t in leaf.tensors()
            if t.is_floating_point()
        )

    def data_version(self) -> tuple[int | None, ...]:
        """The in-place version counters of the tensors the leaves of this mask hold: a change
        (``t[...] = x`` on a tensor given to :func:`from_tensor`, ``key_padding``, ...) means the
        cached block maps and plans describe old data. Inference tensors keep no counter
        (None): changing one in place inside ``torch.inference_mode`` is not seen."""
        return tuple(version(t) for t in self.tensors())

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

    # --- helpers ------------------------------------------------------------------------------
    def _batch_numel(self) -> int:
        return math.prod(self.batch_shape)

    def classes(self, q_len: int, kv_len: int, block_q: int, block_kv: int) -> Tensor:
        """Exact classes of the allowed part (any bias ignored, unlike :meth:`block_map`): int8
        batch_shape + (nq, nk), contiguous, unchecked arguments; cached: treat as read-only."""
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
        qi = torch.arange(q0, q1, device="cpu")[:, None]
        kj = torch.arange(k0, k1, device="cpu")[None, :]
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
        qi = torch.arange(q0, q1, device="cpu")[:, None]
        kj = torch.arange(k0, k1, device="cpu")[None, :]
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
            bm = self.classes(q_len, kv_len, block_q, block_kv)
            if self.has_bias:
                bm = torch.where(
                    bm == FULL, torch.tensor(PARTIAL, dtype=torch.int8, device="cpu"), bm
                )
            cache.put(key, bm)
        return bm

    def __and__(self, other: Mask) -> Mask:
        return Intersection(self, require_mask(other, "&"))

    def __or__(self, other: Mask) -> Mask:
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


# ---------------------------------------------------------------------------------------------
# combinations
# ---------------------------------------------------------------------------------------------
class _Pair(Mask):
    """Two masks combined element-wise; ``a`` and ``b`` (also :attr:`parts`) are the operands."""

    def __init__(self, a: Mask, b: Mask) -> None:
        self.a, self.b = require_mask(a, "a"), require_mask(b, "b")
        self.batch_shape = common_batch(a, b)

    @property
    def parts(self) -> tuple[Mask, ...]:
        return (self.a, self.b)

    def _lifted(self, fa, fb):
        nb = len(self.batch_shape)
        return (None if fa is None else lift_batch(fa, nb)), (
            None if fb is None else lift_batch(fb, nb)
        )

    _parts = _lifted  # older private name

    def _both(self, q_len, kv_len, block_q, block_kv):
        return self._lifted(
            self.a.classes(q_len, kv_len, block_q, block_kv),
            self.b.classes(q_len, kv_len, block_q, block_kv),
        )


class Intersection(_Pair):
    """``a & b``: a key is allowed where both masks allow it; score biases add up.
    ``Intersection(causal(), key_padding([2]))`` equals ``causal() & key_padding([2])``."""

    def __init__(self, a: Mask, b: Mask) -> None:
        super().__init__(a, b)
        self.has_bias = a.has_bias or b.has_bias

    def _allowed(self, qi, kj, q_len, kv_len):
        a, b = self._lifted(
            self.a._allowed(qi, kj, q_len, kv_len), self.b._allowed(qi, kj, q_len, kv_len)
        )
        return a & b

    def _bias(self, qi, kj, q_len, kv_len):
        ba = self.a._bias(qi, kj, q_len, kv_len) if self.a.has_bias else None
        bb = self.b._bias(qi, kj, q_len, kv_len) if self.b.has_bias else None
        ba, bb = self._lifted(ba, bb)
        if ba is None or bb is None:
            return bb if ba is None else ba
        if torch.promote_types(ba.dtype, bb.dtype) != torch.float64:  # the sum of two float32
            ba, bb = ba.double(), bb.double()  # biases is exact in float64, rounded once later
        return ba + bb

    def as_band(self) -> Any:
        ba, bb = self.a.as_band(), self.b.as_band()
        if ba is None or bb is None:
            return None
        return ba.intersect(bb)

    _band = as_band

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        band = self.as_band()
        if band is not None:
            return band._block_map(q_len, kv_len, block_q, block_kv)
        ma, mb = self._both(q_len, kv_len, block_q, block_kv)
        full = (ma == FULL) & (mb == FULL)
        empty = (ma == EMPTY) | (mb == EMPTY)
        bm = classify(full, ~empty).expand(self.batch_shape + full.shape[-2:])
        # two partial blocks may leave nothing allowed together: evaluate those exactly
        ambiguous = ((ma == PARTIAL) & (mb == PARTIAL)).expand(bm.shape)
        return refine(self, bm, ambiguous, q_len, kv_len, block_q, block_kv)

    def __repr__(self) -> str:
        return f"({self.a!r} & {self.b!r})"


class Union(_Pair):
    """``a | b``: a key is allowed where either mask allows it. Not defined for masks with a
    score bias (ambiguous): combine the boolean parts with ``|`` and add the bias with ``&``."""

    def __init__(self, a: Mask, b: Mask) -> None:
        if require_mask(a, "a").has_bias or require_mask(b, "b").has_bias:
            raise ValueError(
                "mask: '|' is not defined for masks with a score bias (additive float masks, "
                "ALiBi); combine the boolean parts with '|' and add the bias with '&'"
            )
        super().__init__(a, b)

    def _allowed(self, qi, kj, q_len, kv_len):
        a, b = self._lifted(
            self.a._allowed(qi, kj, q_len, kv_len), self.b._allowed(qi, kj, q_len, kv_len)
        )
        return a | b

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        ma, mb = self._both(q_len, kv_len, block_q, block_kv)
        full = (ma == FULL) | (mb == FULL)
        empty = (ma == EMPTY) & (mb == EMPTY)
        bm = classify(full, ~empty).expand(self.batch_shape + full.shape[-2:])
        # two partial blocks may together cover the block: evaluate those exactly
        ambiguous = ((ma == PARTIAL) & (mb == PARTIAL)).expand(bm.shape)
        return refine(self, bm, ambiguous, q_len, kv_len, block_q, block_kv)

    def __repr__(self) -> str:
        return f"({self.a!r} | {self.b!r})"
