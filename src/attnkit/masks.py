"""Mask objects. **True = may attend**, everywhere in attnkit.

A mask says which keys each query may attend to. Mask objects are small and lazy: they never
build the full ``Lq x Lk`` grid unless asked (:meth:`Mask.materialize`), and they classify blocks
of the grid as empty, full or partial cheaply and exactly (:meth:`Mask.block_map`), which is what
lets the block-sparse kernel skip masked work. Block maps are cached on the mask object per
``(Lq, Lk, block_q, block_kv)``; masks that hold tensors are immutable by convention (do not
modify the tensors you passed in after building the mask).

Shape legend
------------
``B``   batch (the leading batch dimension of ``q``; masks built from per-batch data carry it)
``Lq``  query length, ``i`` a query position
``Lk``  key length, ``j`` a key position
``nq``, ``nk``  numbers of query / key blocks

Masks that depend on the batch element (:func:`key_padding`, :func:`document`, per-batch
:func:`prefix_lm`, :func:`from_predicate`, batched :func:`from_tensor`) align their batch dimension
with the *leading* batch dimension of the attention inputs; every other batch dimension (heads,
...) is broadcast.

Combine masks with ``&`` (both allow) and ``|`` (either allows). Additive float masks (seed 001's
``M``, ALiBi) carry a score bias; ``&`` adds biases, ``|`` with a bias is refused (ambiguous).

The other convention (True = *ignore*, as in ``torch.nn.MultiheadAttention``'s
``key_padding_mask``) is converted only through the named helper :func:`from_key_padding_mask`.

The grids in the docstrings below are checked against :meth:`Mask.materialize` by the tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

EMPTY, PARTIAL, FULL = 0, 1, 2
"""Block classes returned by :meth:`Mask.block_map` (int8 values)."""

Alignment = Literal["top_left", "bottom_right"]

BLOCK_MAP_CACHE_SIZE = 16
"""Block maps kept per mask object (least recently computed dropped first)."""

_EVAL_ELEMENTS = 2**22
"""Most mask entries evaluated at once when a block map needs exact evaluation."""

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "Mask",
    "alibi",
    "alibi_slopes",
    "as_mask",
    "causal",
    "document",
    "from_additive",
    "from_key_padding_mask",
    "from_predicate",
    "from_tensor",
    "key_padding",
    "prefix_lm",
    "sliding_window",
]


def _check_alignment(alignment: object) -> None:
    if alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"alignment: expected 'top_left' or 'bottom_right', got {alignment!r}")


def _offset(alignment: str, q_len: int, kv_len: int) -> int:
    """Shift added to a query index so that it lines up with key indices."""
    return kv_len - q_len if alignment == "bottom_right" else 0


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _block_edges(n: int, block: int) -> tuple[Tensor, Tensor]:
    """First and last index (inclusive) of every block of ``range(n)``: two (n_blocks,) tensors."""
    starts = torch.arange(0, n, block)
    ends = torch.clamp(starts + block, max=n) - 1
    return starts, ends


def _classify(all_in: Tensor, any_in: Tensor) -> Tensor:
    """Block classes (int8) from 'every entry allowed' / 'some entry allowed' booleans."""
    all_in, any_in = torch.broadcast_tensors(all_in, any_in)
    out = torch.full(all_in.shape, PARTIAL, dtype=torch.int8)
    out[~any_in] = EMPTY
    out[all_in] = FULL
    return out


def _classify_tile(t: Tensor, block_q: int, block_kv: int) -> Tensor:
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
    return _classify(all_b, any_b)


def _check_sizes(q_len: int, kv_len: int) -> None:
    for name, n in (("q_len", q_len), ("kv_len", kv_len)):
        if not _is_int(n) or n < 1:
            raise ValueError(f"{name}: expected a positive int, got {n!r}")


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
            parts.append(_classify_tile(t, block_q, block_kv))
        out = torch.cat(parts, dim=-2)
        assert out.shape[-2:] == (nq, nk)
        return out

    def _band(self) -> _Band | None:
        """This mask as a single band ``lo <= j - (i + offset) <= hi`` when it is one, else None
        (used to merge intersections of bands and by the block-sparse kernel)."""
        return None

    # --- helpers ------------------------------------------------------------------------------
    def _batch_numel(self) -> int:
        return math.prod(self.batch_shape)

    def _cache(self) -> dict:
        return self.__dict__.setdefault("_block_map_cache", {})

    def _classes(self, q_len: int, kv_len: int, block_q: int, block_kv: int) -> Tensor:
        """Cached exact classes of the allowed part, int8 batch_shape + (nq, nk), contiguous."""
        key = ("allowed", q_len, kv_len, block_q, block_kv)
        cache = self._cache()
        if key not in cache:
            nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
            bm = self._block_map(q_len, kv_len, block_q, block_kv)
            bm = bm.expand(self.batch_shape + (nq, nk)).contiguous()
            _cache_put(cache, key, bm)
        return cache[key]

    # --- public API --------------------------------------------------------------------------
    def materialize(self, q_len: int, kv_len: int) -> Tensor:
        """The mask as a bool tensor of shape batch_shape + (Lq, Lk): (Lq, Lk), or (B, Lq, Lk)
        for per-batch masks."""
        _check_sizes(q_len, kv_len)
        return self.tile(0, q_len, 0, kv_len, q_len, kv_len)

    def tile(self, q0: int, q1: int, k0: int, k1: int, q_len: int, kv_len: int) -> Tensor:
        """Rows ``q0:q1``, columns ``k0:k1`` of the materialized mask:
        batch_shape + (q1-q0, k1-k0) bool (possibly an expanded view)."""
        qi = torch.arange(q0, q1)[:, None]
        kj = torch.arange(k0, k1)[None, :]
        out = self._allowed(qi, kj, q_len, kv_len)
        return out.expand(self.batch_shape + (q1 - q0, k1 - k0))

    def bias_tile(
        self, q0: int, q1: int, k0: int, k1: int, q_len: int, kv_len: int
    ) -> Tensor | None:
        """Score bias for a tile: batch_shape + (q1-q0, k1-k0) float, or None when there is none."""
        if not self.has_bias:
            return None
        qi = torch.arange(q0, q1)[:, None]
        kj = torch.arange(k0, k1)[None, :]
        b = self._bias(qi, kj, q_len, kv_len)
        if b is None:
            return None
        return b.expand(self.batch_shape + (q1 - q0, k1 - k0))

    def materialize_bias(self, q_len: int, kv_len: int) -> Tensor | None:
        """The additive bias as a float tensor batch_shape + (Lq, Lk), or None."""
        _check_sizes(q_len, kv_len)
        return self.bias_tile(0, q_len, 0, kv_len, q_len, kv_len)

    def block_map(self, q_len: int, kv_len: int, block_q: int, block_kv: int) -> Tensor:
        """Classify every (block_q x block_kv) block: int8 batch_shape + (nq, nk) of
        EMPTY (no entry allowed) / PARTIAL / FULL (every entry allowed).

        Exact, and computed without building the Lq x Lk grid for the structured masks
        (causal, sliding windows, key padding, documents, prefix-LM and their combinations);
        the last block in each direction may be shorter. A block with a score bias is never
        FULL (it needs the bias applied), only PARTIAL or EMPTY. The result is cached on the
        mask per (q_len, kv_len, block_q, block_kv): treat it as read-only.
        """
        _check_sizes(q_len, kv_len)
        for name, b in (("block_q", block_q), ("block_kv", block_kv)):
            if not _is_int(b) or b < 1:
                raise ValueError(f"{name}: expected a positive int, got {b!r}")
        key = ("public", q_len, kv_len, block_q, block_kv)
        cache = self._cache()
        if key not in cache:
            bm = self._classes(q_len, kv_len, block_q, block_kv)
            if self.has_bias:
                bm = torch.where(bm == FULL, torch.tensor(PARTIAL, dtype=torch.int8), bm)
            _cache_put(cache, key, bm)
        return cache[key]

    def __and__(self, other: Mask) -> Mask:
        return _And(self, _require_mask(other, "&"))

    def __or__(self, other: Mask) -> Mask:
        return _Or(self, _require_mask(other, "|"))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._repr_fields().items())
        return f"{type(self).__name__}({fields})"

    def _repr_fields(self) -> dict:
        return {}


def _cache_put(cache: dict, key: tuple, value: Tensor) -> None:
    if len(cache) >= 2 * BLOCK_MAP_CACHE_SIZE:
        cache.pop(next(iter(cache)))
    cache[key] = value


def _require_mask(other: object, op: str) -> Mask:
    if not isinstance(other, Mask):
        raise TypeError(f"mask {op} other: expected a Mask, got {type(other).__name__}")
    return other


def _common_batch(a: Mask, b: Mask) -> tuple[int, ...]:
    """Left-aligned broadcast of two batch shapes."""
    n = max(len(a.batch_shape), len(b.batch_shape))
    sa = a.batch_shape + (1,) * (n - len(a.batch_shape))
    sb = b.batch_shape + (1,) * (n - len(b.batch_shape))
    out = []
    for x, y in zip(sa, sb, strict=True):
        if x != y and 1 not in (x, y):
            raise ValueError(
                f"mask: cannot combine masks with batch shapes {a.batch_shape} and {b.batch_shape}"
            )
        out.append(max(x, y))
    return tuple(out)


def _lift(x: Tensor, nb: int) -> Tensor:
    """Insert singleton dims after the batch dims of ``x`` (..., n, m) so it has ``nb`` of them."""
    have = x.dim() - 2
    if have >= nb:
        return x
    return x.reshape(x.shape[:-2] + (1,) * (nb - have) + x.shape[-2:])


def _refine(mask: Mask, bm: Tensor, ambiguous: Tensor, q_len, kv_len, block_q, block_kv) -> Tensor:
    """Replace the blocks flagged ``ambiguous`` in ``bm`` (both batch_shape + (nq, nk)) by their
    exact classes, evaluating ``mask`` only on the key span of each affected block row."""
    rows = ambiguous.reshape(-1, *ambiguous.shape[-2:]).any(0)  # (nq, nk)
    if not bool(rows.any()):
        return bm
    bm = bm.clone(memory_format=torch.contiguous_format)
    for qb in rows.any(1).nonzero().flatten().tolist():
        cols = rows[qb].nonzero().flatten()
        c0, c1 = int(cols[0]), int(cols[-1]) + 1
        q0, q1 = qb * block_q, min((qb + 1) * block_q, q_len)
        k0, k1 = c0 * block_kv, min(c1 * block_kv, kv_len)
        exact = _classify_tile(mask.tile(q0, q1, k0, k1, q_len, kv_len), block_q, block_kv)
        sel = ambiguous[..., qb, c0:c1]
        bm[..., qb, c0:c1] = torch.where(sel, exact[..., 0, :], bm[..., qb, c0:c1])
    return bm


class _And(Mask):
    def __init__(self, a: Mask, b: Mask) -> None:
        self.a, self.b = a, b
        self.batch_shape = _common_batch(a, b)
        self.has_bias = a.has_bias or b.has_bias

    def _parts(self, fa, fb):
        nb = len(self.batch_shape)
        return (None if fa is None else _lift(fa, nb)), (None if fb is None else _lift(fb, nb))

    def _allowed(self, qi, kj, q_len, kv_len):
        a, b = self._parts(
            self.a._allowed(qi, kj, q_len, kv_len), self.b._allowed(qi, kj, q_len, kv_len)
        )
        return a & b

    def _bias(self, qi, kj, q_len, kv_len):
        ba = self.a._bias(qi, kj, q_len, kv_len) if self.a.has_bias else None
        bb = self.b._bias(qi, kj, q_len, kv_len) if self.b.has_bias else None
        ba, bb = self._parts(ba, bb)
        if ba is None:
            return bb
        return ba if bb is None else ba + bb

    def _band(self):
        ba, bb = self.a._band(), self.b._band()
        if ba is None or bb is None or ba.alignment != bb.alignment:
            return None
        return _Band(max(ba.lo, bb.lo), min(ba.hi, bb.hi), ba.alignment)

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        band = self._band()
        if band is not None:
            return band._block_map(q_len, kv_len, block_q, block_kv)
        ma, mb = self._parts(
            self.a._classes(q_len, kv_len, block_q, block_kv),
            self.b._classes(q_len, kv_len, block_q, block_kv),
        )
        full = (ma == FULL) & (mb == FULL)
        empty = (ma == EMPTY) | (mb == EMPTY)
        bm = _classify(full, ~empty).expand(self.batch_shape + full.shape[-2:])
        # two partial blocks may leave nothing allowed together: evaluate those exactly
        ambiguous = ((ma == PARTIAL) & (mb == PARTIAL)).expand(bm.shape)
        return _refine(self, bm, ambiguous, q_len, kv_len, block_q, block_kv)

    def __repr__(self) -> str:
        return f"({self.a!r} & {self.b!r})"


class _Or(Mask):
    def __init__(self, a: Mask, b: Mask) -> None:
        if a.has_bias or b.has_bias:
            raise ValueError(
                "mask: '|' is not defined for masks with a score bias (additive float masks, "
                "ALiBi); combine the boolean parts with '|' and add the bias with '&'"
            )
        self.a, self.b = a, b
        self.batch_shape = _common_batch(a, b)

    _parts = _And._parts

    def _allowed(self, qi, kj, q_len, kv_len):
        a, b = self._parts(
            self.a._allowed(qi, kj, q_len, kv_len), self.b._allowed(qi, kj, q_len, kv_len)
        )
        return a | b

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        ma, mb = self._parts(
            self.a._classes(q_len, kv_len, block_q, block_kv),
            self.b._classes(q_len, kv_len, block_q, block_kv),
        )
        full = (ma == FULL) | (mb == FULL)
        empty = (ma == EMPTY) & (mb == EMPTY)
        bm = _classify(full, ~empty).expand(self.batch_shape + full.shape[-2:])
        # two partial blocks may together cover the block: evaluate those exactly
        ambiguous = ((ma == PARTIAL) & (mb == PARTIAL)).expand(bm.shape)
        return _refine(self, bm, ambiguous, q_len, kv_len, block_q, block_kv)

    def __repr__(self) -> str:
        return f"({self.a!r} | {self.b!r})"


# ---------------------------------------------------------------------------------------------
# Band masks: allowed iff lo <= j - (i + offset) <= hi. Causal, sliding windows and their
# intersections are all bands, so their block maps come from the block corners.
# ---------------------------------------------------------------------------------------------
class _Band(Mask):
    def __init__(self, lo: float, hi: float, alignment: str) -> None:
        _check_alignment(alignment)
        self.lo, self.hi, self.alignment = lo, hi, alignment

    def _band(self) -> _Band:
        return self

    def offset(self, q_len: int, kv_len: int) -> int:
        """Shift added to query indices before comparing with key indices."""
        return _offset(self.alignment, q_len, kv_len)

    def _allowed(self, qi, kj, q_len, kv_len):
        d = kj - (qi + _offset(self.alignment, q_len, kv_len))
        out = torch.ones(d.shape, dtype=torch.bool)
        if self.lo != -math.inf:
            out &= d >= self.lo
        if self.hi != math.inf:
            out &= d <= self.hi
        return out

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        qs, qe = _block_edges(q_len, block_q)
        ks, ke = _block_edges(kv_len, block_kv)
        off = _offset(self.alignment, q_len, kv_len)
        qs, qe = (qs + off)[:, None], (qe + off)[:, None]
        ks, ke = ks[None, :], ke[None, :]
        dmin = ks - qe  # smallest j - i in the block (every value up to dmax occurs)
        dmax = ke - qs  # largest j - i in the block
        any_in = (dmax >= self.lo) & (dmin <= self.hi)
        all_in = (dmin >= self.lo) & (dmax <= self.hi)
        return _classify(all_in, any_in)

    def _repr_fields(self):
        return {"lo": self.lo, "hi": self.hi, "alignment": self.alignment}


class causal(_Band):  # noqa: N801 - lower-case like a function, as users call it
    """Causal mask: query ``i`` may attend to keys ``j <= i`` (after alignment).

    ``alignment="top_left"`` aligns the first query with the first key; ``"bottom_right"``
    aligns the last query with the last key (decoding with a KV cache, Lq < Lk). For Lq = 3,
    Lk = 5::

        top_left        bottom_right
        1 0 0 0 0       1 1 1 0 0
        1 1 0 0 0       1 1 1 1 0
        1 1 1 0 0       1 1 1 1 1

    With Lq > Lk, bottom-right alignment leaves the first Lq - Lk rows without any key (they
    give output 0).
    """

    def __init__(self, alignment: Alignment = "top_left") -> None:
        super().__init__(-math.inf, 0, alignment)

    def _repr_fields(self):
        return {"alignment": self.alignment}


class sliding_window(_Band):  # noqa: N801
    """Sliding window: query ``i`` may attend to keys ``i - left <= j <= i + right`` (after
    alignment, as in :class:`causal`).

    ``right`` defaults to ``left`` (symmetric window); ``sliding_window(w) & causal()`` (or
    ``sliding_window(w, 0)``) gives a local-causal mask. ``sliding_window(1)`` and
    ``sliding_window(2, 0)`` on 5 x 5::

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
        right = left if right is None else right
        for name, w in (("left", left), ("right", right)):
            if not _is_int(w) or w < 0:
                raise ValueError(f"sliding_window: {name} must be an int >= 0, got {w!r}")
        super().__init__(-left, right, alignment)
        self.left, self.right = left, right

    def _repr_fields(self):
        return {"left": self.left, "right": self.right, "alignment": self.alignment}


def _as_index_tensor(x, name: str, ndim: tuple[int, ...]) -> Tensor:
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"{name}: expected integers, got {type(x).__name__} ({e})") from None
    if 0 in t.shape:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name}: expected an integer tensor, got dtype {t.dtype}")
    if t.dim() not in ndim:
        want = " or ".join(map(str, ndim))
        raise ValueError(f"{name}: expected {want} dims, got shape {tuple(t.shape)}")
    return t.to(torch.long).cpu().clone()


class key_padding(Mask):  # noqa: N801
    """Key padding: in batch element ``b`` only keys ``j < lengths[b]`` are valid.

    ``lengths``: (B,) integer valid-key counts (>= 0; a count of 0 leaves the rows without any
    key, and they give output 0). ``key_padding([3, 1])`` with Lq = 2, Lk = 4::

        b=0: 1 1 1 0      b=1: 1 0 0 0
             1 1 1 0           1 0 0 0
    """

    def __init__(self, lengths) -> None:
        self.lengths = _as_index_tensor(lengths, "lengths", (1,))
        if (self.lengths < 0).any():
            raise ValueError(f"lengths: expected counts >= 0, got {self.lengths.tolist()}")
        self.batch_shape = (int(self.lengths.shape[0]),)

    def _allowed(self, qi, kj, q_len, kv_len):
        return kj[None] < self.lengths[:, None, None]

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        ks, ke = _block_edges(kv_len, block_kv)
        n = self.lengths[:, None]
        any_in = ks[None, :] < n
        all_in = ke[None, :] < n
        return _classify(all_in, any_in)[:, None, :]

    def _repr_fields(self):
        return {"lengths": self.lengths.tolist()}


def _presence(x: Tensor, block: int, n_ids: int) -> Tensor:
    """(R, L) ids in [0, n_ids) -> (R, ceil(L / block), n_ids) float32: 1 where the id occurs
    in the block."""
    r, length = x.shape
    nb = math.ceil(length / block)
    p = torch.zeros(r * nb * n_ids, dtype=torch.float32)
    blk = torch.arange(length) // block
    idx = (torch.arange(r)[:, None] * nb + blk[None, :]) * n_ids + x
    p[idx.flatten()] = 1.0
    return p.reshape(r, nb, n_ids)


class document(Mask):  # noqa: N801
    """Document (block-diagonal) mask: attend only within the same document.

    ``ids``: integer document id per position, (L,) or (B, L); ``kv_ids`` for the keys when they
    differ from the queries (defaults to ``ids``; same batch layout). Ids need not be sorted.
    ids ``[0, 0, 1, 1, 1]`` and ids ``[0, 1, 0]``::

        [0, 0, 1, 1, 1]   [0, 1, 0]
        1 1 0 0 0         1 0 1
        1 1 0 0 0         0 1 0
        0 0 1 1 1         1 0 1
        0 0 1 1 1
        0 0 1 1 1

    Block maps are exact for any ids and cost O(L + nq * nk * n_docs), never Lq x Lk.
    """

    def __init__(self, ids, kv_ids=None) -> None:
        self.ids = _as_index_tensor(ids, "ids", (1, 2))
        self.kv_ids = self.ids if kv_ids is None else _as_index_tensor(kv_ids, "kv_ids", (1, 2))
        if self.ids.dim() != self.kv_ids.dim() or (
            self.ids.dim() == 2 and self.ids.shape[0] != self.kv_ids.shape[0]
        ):
            raise ValueError(
                f"kv_ids: expected the same batch layout as ids {tuple(self.ids.shape)}, "
                f"got {tuple(self.kv_ids.shape)}"
            )
        self.batch_shape = (int(self.ids.shape[0]),) if self.ids.dim() == 2 else ()

    def _check_len(self, q_len: int, kv_len: int) -> None:
        if self.ids.shape[-1] != q_len or self.kv_ids.shape[-1] != kv_len:
            raise ValueError(
                f"document: ids cover {self.ids.shape[-1]} queries and {self.kv_ids.shape[-1]} "
                f"keys, but the attention has Lq={q_len}, Lk={kv_len}"
            )

    def _allowed(self, qi, kj, q_len, kv_len):
        self._check_len(q_len, kv_len)
        a = self.ids[..., qi[:, 0]][..., :, None]
        b = self.kv_ids[..., kj[0, :]][..., None, :]
        return a == b

    def is_sorted(self) -> bool:
        """True when ids and kv_ids are non-decreasing (packed sequences)."""
        return bool((self.ids[..., 1:] >= self.ids[..., :-1]).all()) and bool(
            (self.kv_ids[..., 1:] >= self.kv_ids[..., :-1]).all()
        )

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        self._check_len(q_len, kv_len)
        qids = self.ids.reshape(-1, q_len)
        kids = self.kv_ids.reshape(-1, kv_len)
        both = torch.cat([qids.flatten(), kids.flatten()])
        lo, hi = int(both.min()), int(both.max())
        if hi - lo < both.numel():  # small id range: use the ids themselves (no sort)
            inv, n_ids = both - lo, hi - lo + 1
        else:
            uniq, inv = torch.unique(both, return_inverse=True)
            n_ids = len(uniq)
        rows = qids.shape[0]
        nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
        if rows * max(nq, nk) * n_ids > 4 * _EVAL_ELEMENTS:  # many distinct ids: evaluate
            return super()._block_map(q_len, kv_len, block_q, block_kv)
        pq = _presence(inv[: qids.numel()].reshape(qids.shape), block_q, n_ids)
        pk = _presence(inv[qids.numel() :].reshape(kids.shape), block_kv, n_ids)
        any_in = (pq @ pk.transpose(1, 2)) > 0  # a shared id exists (exact: sums of 0/1)
        single_q = pq.sum(-1) == 1
        single_k = pk.sum(-1) == 1
        all_in = any_in & single_q[:, :, None] & single_k[:, None, :]
        out = _classify(all_in, any_in)
        return out if self.batch_shape else out[0]

    def spans(self, which: str = "ids") -> list[list[tuple[int, int, int]]]:
        """Runs of equal ids per batch row: ``[[(id, start, end), ...], ...]`` (end exclusive);
        one list per batch row (a single one for (L,) ids). ``which`` is "ids" or "kv_ids"."""
        if which not in ("ids", "kv_ids"):
            raise ValueError(f"which: expected 'ids' or 'kv_ids', got {which!r}")
        t = self.ids if which == "ids" else self.kv_ids
        t = t.reshape(-1, t.shape[-1])
        out = []
        for row in t:
            change = (row[1:] != row[:-1]).nonzero().flatten() + 1
            starts = [0] + change.tolist()
            ends = change.tolist() + [row.shape[0]]
            out.append([(int(row[s]), s, e) for s, e in zip(starts, ends, strict=True)])
        return out

    def _repr_fields(self):
        return {"ids": tuple(self.ids.shape)}


class prefix_lm(Mask):  # noqa: N801
    """Prefix-LM mask: keys ``j < prefix_len`` are visible to all queries, the rest causally
    (``j <= i``, top-left aligned).

    ``prefix_len``: an int >= 0, or (B,) ints per batch element. ``prefix_lm(2)`` on 4 x 4::

        1 1 0 0
        1 1 0 0
        1 1 1 0
        1 1 1 1
    """

    def __init__(self, prefix_len) -> None:
        if _is_int(prefix_len) or (isinstance(prefix_len, Tensor) and prefix_len.dim() == 0):
            self.prefix = _as_index_tensor(prefix_len, "prefix_len", (0,)).reshape(1)
            self.batch_shape = ()
        else:
            self.prefix = _as_index_tensor(prefix_len, "prefix_len", (1,))
            self.batch_shape = (int(self.prefix.shape[0]),)
        if (self.prefix < 0).any():
            raise ValueError(f"prefix_len: expected >= 0, got {self.prefix.tolist()}")

    def _p(self) -> Tensor:
        return self.prefix[:, None, None] if self.batch_shape else self.prefix[0]

    def _allowed(self, qi, kj, q_len, kv_len):
        return (kj < self._p()) | (kj <= qi)

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        c = causal()._block_map(q_len, kv_len, block_q, block_kv)
        ks, ke = _block_edges(kv_len, block_kv)
        p = self._p()
        pre_full = ke[None, :] < p  # (1, nk) or (B, 1, nk): the block's keys are all prefix
        pre_any = ks[None, :] < p
        # exact: a block is full iff causal-full or all its keys are in the prefix; empty iff
        # causal-empty and none of its keys is in the prefix
        full = (c == FULL) | pre_full
        empty = (c == EMPTY) & ~pre_any
        return _classify(full, ~empty)

    def _repr_fields(self):
        p = self.prefix.tolist()
        return {"prefix_len": p if self.batch_shape else p[0]}


class from_predicate(Mask):  # noqa: N801
    """A mask from a predicate ``fn(b, h, q_idx, kv_idx) -> bool tensor`` (FlexAttention's
    ``mask_mod`` form, True = may attend).

    ``fn`` must be vectorised: it is called with broadcastable int64 index tensors ``q_idx``
    (n, 1) and ``kv_idx`` (1, m); ``b`` is ``arange(batch_size)`` shaped (B, 1, 1) -- (B, 1, 1, 1)
    when ``num_heads`` is also given -- or a 0-d zero; ``h`` is ``arange(num_heads)`` shaped
    (H, 1, 1), or a 0-d zero. The result must broadcast to ([B,] [H,] n, m); the mask's
    batch_shape is (B,), (B or 1, H) or (). ``from_predicate(lambda b, h, q, k: (q + k) % 2 == 0)``
    on 3 x 3::

        1 0 1
        0 1 0
        1 0 1

    Block maps evaluate the predicate in rows of blocks (O(block_q x Lk) memory per row, Lq x Lk
    work), so prefer the named masks when one fits.
    """

    def __init__(
        self,
        fn: Callable[..., Tensor],
        batch_size: int | None = None,
        num_heads: int | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
        for name, n in (("batch_size", batch_size), ("num_heads", num_heads)):
            if n is not None and (not _is_int(n) or n < 1):
                raise ValueError(f"{name}: expected a positive int or None, got {n!r}")
        self.fn = fn
        self.batch_size, self.num_heads = batch_size, num_heads
        if num_heads:
            self.batch_shape = (batch_size or 1, num_heads)
        else:
            self.batch_shape = (batch_size,) if batch_size else ()

    def _allowed(self, qi, kj, q_len, kv_len):
        zero = torch.zeros((), dtype=torch.long)
        nb = len(self.batch_shape)
        b = (
            torch.arange(self.batch_size).reshape((-1,) + (1,) * (nb + 1))
            if self.batch_size
            else zero
        )
        h = torch.arange(self.num_heads)[:, None, None] if self.num_heads else zero
        out = self.fn(b, h, qi, kj)
        if not isinstance(out, Tensor) or out.dtype != torch.bool:
            got = out.dtype if isinstance(out, Tensor) else type(out).__name__
            raise TypeError(f"fn: expected the predicate to return a bool tensor, got {got}")
        want = self.batch_shape + (qi.shape[0], kj.shape[1])
        try:
            return torch.broadcast_to(out, want)
        except RuntimeError:
            raise ValueError(
                f"fn: expected the predicate's result to broadcast to {want}, "
                f"got shape {tuple(out.shape)}"
            ) from None

    def _repr_fields(self):
        return {"fn": getattr(self.fn, "__name__", "fn")}


class from_tensor(Mask):  # noqa: N801
    """A mask from an explicit tensor ``t``.

    A bool tensor is True = may attend. A float tensor is *added* to the scores (seed 001's
    ``M``); ``-inf`` entries disallow a key. Shape (..., Lq, Lk): its leading dims line up with
    the *leading* batch dims of the inputs (each 1 or equal). ``attnkit.functional`` first
    right-aligns a tensor given as ``mask=`` (torch broadcasting, e.g. (Lq, Lk) or
    (B, 1, Lq, Lk) for (B, H, Lq, d) inputs) and then wraps it here. The bool tensor
    ``[[1, 0, 1], [0, 1, 1]]`` is simply::

        1 0 1
        0 1 1
    """

    def __init__(self, t: Tensor) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"mask (t): expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bool and not t.is_floating_point():
            raise TypeError(f"mask (t): expected a bool or floating tensor, got dtype {t.dtype}")
        if t.dim() < 2:
            raise ValueError(
                f"mask (t): expected a tensor of shape (..., Lq, Lk), got {tuple(t.shape)}"
            )
        self.t = t
        self.batch_shape = tuple(t.shape[:-2])
        self.has_bias = t.is_floating_point()

    def _check_len(self, q_len, kv_len):
        if tuple(self.t.shape[-2:]) != (q_len, kv_len):
            raise ValueError(
                f"mask: expected (Lq, Lk) = ({q_len}, {kv_len}) in the last two dims, "
                f"got shape {tuple(self.t.shape)}"
            )

    def _sel(self, qi, kj):
        t = self.t.index_select(-2, qi[:, 0].to(self.t.device))
        return t.index_select(-1, kj[0, :].to(self.t.device)).cpu()

    def _allowed(self, qi, kj, q_len, kv_len):
        self._check_len(q_len, kv_len)
        s = self._sel(qi, kj)
        return s if s.dtype == torch.bool else s != -math.inf

    def _bias(self, qi, kj, q_len, kv_len):
        s = self._sel(qi, kj)
        return torch.where(s == -math.inf, torch.zeros((), dtype=s.dtype), s)

    def _repr_fields(self):
        return {"shape": tuple(self.t.shape), "dtype": self.t.dtype}


class alibi(Mask):  # noqa: N801
    """ALiBi (Press et al.) as a score bias: ``bias[i, j] = -slope * |j - (i + Lk - Lq)|``
    (bottom-right aligned when Lq != Lk); every key stays allowed. One slope for all heads here;
    for per-head slopes use :func:`alibi_slopes` with a bias per head in ``attnkit.nn``.
    ``alibi(1)`` on 3 x 4 (the bias; the allowed grid is all ones)::

        -1  0 -1 -2
        -2 -1  0 -1
        -3 -2 -1  0
    """

    has_bias = True

    def __init__(self, slope: float) -> None:
        if isinstance(slope, bool) or not (
            isinstance(slope, (int, float)) and math.isfinite(slope)
        ):
            raise ValueError(f"slope: expected a finite number, got {slope!r}")
        self.slope = float(slope)

    def _allowed(self, qi, kj, q_len, kv_len):
        return torch.ones((qi.shape[0], kj.shape[1]), dtype=torch.bool)

    def _bias(self, qi, kj, q_len, kv_len):
        d = (kj - (qi + (kv_len - q_len))).abs().to(torch.float64)
        return -self.slope * d

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
        return torch.full((nq, nk), FULL, dtype=torch.int8)  # every key allowed

    def _repr_fields(self):
        return {"slope": self.slope}


def alibi_slopes(num_heads: int) -> Tensor:
    """The ALiBi head slopes of Press et al.: (num_heads,) float64, 2^(-8 k / n) for k = 1..n
    (with the paper's interleaving when n is not a power of two)."""
    if not _is_int(num_heads) or num_heads < 1:
        raise ValueError(f"num_heads: expected a positive int, got {num_heads!r}")

    def pow2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        s = pow2(num_heads)
    else:
        c = 2 ** math.floor(math.log2(num_heads))
        s = pow2(c) + pow2(2 * c)[0::2][: num_heads - c]
    return torch.tensor(s, dtype=torch.float64)


def from_key_padding_mask(m: Tensor) -> Mask:
    """Convert a ``torch.nn.MultiheadAttention``-style ``key_padding_mask`` (B, Lk), where
    **True means ignore**, into an attnkit mask (True = may attend). A float (B, Lk) mask is
    added to the scores of every query (``-inf`` ignores the key), as in torch.

    ``[[False, False, True]]`` (ignore the last key) becomes, for Lq = 2::

        1 1 0
        1 1 0
    """
    if not isinstance(m, Tensor):
        raise TypeError(f"key_padding_mask: expected a torch.Tensor, got {type(m).__name__}")
    if m.dtype != torch.bool and not m.is_floating_point():
        raise TypeError(f"key_padding_mask: expected bool or float, got dtype {m.dtype}")
    if m.dim() != 2 or 0 in m.shape:
        raise ValueError(f"key_padding_mask: expected (B, Lk), got shape {tuple(m.shape)}")
    return _KeyColumns(m if m.is_floating_point() else ~m)


class _KeyColumns(Mask):
    """Per-batch key columns: bool (B, Lk) True = may attend, or float (B, Lk) added."""

    def __init__(self, cols: Tensor) -> None:
        self.cols = cols.cpu()
        self.batch_shape = (int(cols.shape[0]),)
        self.has_bias = cols.is_floating_point()

    def _check_len(self, kv_len):
        if self.cols.shape[1] != kv_len:
            raise ValueError(
                f"key_padding_mask: expected (B, Lk) with Lk={kv_len}, got {tuple(self.cols.shape)}"
            )

    def _ok(self) -> Tensor:
        c = self.cols
        return c if c.dtype == torch.bool else c != -math.inf

    def _allowed(self, qi, kj, q_len, kv_len):
        self._check_len(kv_len)
        c = self._ok()[:, kj[0, :]][:, None, :]
        return c.expand(-1, qi.shape[0], -1)

    def _bias(self, qi, kj, q_len, kv_len):
        c = self.cols[:, kj[0, :]][:, None, :]
        c = torch.where(c == -math.inf, torch.zeros((), dtype=c.dtype), c)
        return c.expand(-1, qi.shape[0], -1)

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        self._check_len(kv_len)
        return _classify_tile(self._ok()[:, None, :], 1, block_kv)  # (B, 1, nk)

    def _repr_fields(self):
        return {"shape": tuple(self.cols.shape), "dtype": self.cols.dtype}


def from_additive(m: Tensor) -> Mask:
    """Convert an additive float mask (added to the scores; ``-inf`` disallows, seed 001's
    ``M``) of shape (Lq, Lk) or (B, Lq, Lk) into a mask object. ``[[0, -inf], [0.5, 0]]``
    allows::

        1 0
        1 1
    """
    if not isinstance(m, Tensor) or not m.is_floating_point():
        got = m.dtype if isinstance(m, Tensor) else type(m).__name__
        raise TypeError(f"m: expected a floating tensor (additive mask), got {got}")
    return from_tensor(m)


def as_mask(mask: Mask | Tensor | None) -> Mask | None:
    """Normalise a user's ``mask`` argument: a Mask, a tensor (:class:`from_tensor`), or None."""
    if mask is None or isinstance(mask, Mask):
        return mask
    if isinstance(mask, Tensor):
        return from_tensor(mask)
    raise TypeError(
        "mask: expected a Mask object, a bool/float torch.Tensor or None, "
        f"got {type(mask).__name__}"
    )
