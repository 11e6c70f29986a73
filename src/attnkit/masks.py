"""Mask objects. **True = may attend**, everywhere in attnkit.

A mask says which keys each query may attend to. Mask objects are small and lazy: they never
build the full ``Lq x Lk`` grid unless asked (:meth:`Mask.materialize`), and they classify blocks
of the grid as empty, full or partial cheaply (:meth:`Mask.block_map`), which is what lets the
block-sparse kernel skip masked work.

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

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "Mask",
    "alibi",
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


def _check_alignment(alignment: str) -> None:
    if alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"alignment: expected 'top_left' or 'bottom_right', got {alignment!r}")


def _offset(alignment: str, q_len: int, kv_len: int) -> int:
    """Shift added to a query index so that it lines up with key indices."""
    return kv_len - q_len if alignment == "bottom_right" else 0


def _block_edges(n: int, block: int) -> tuple[Tensor, Tensor]:
    """First and last index (inclusive) of every block of ``range(n)``: two (n_blocks,) tensors."""
    starts = torch.arange(0, n, block)
    ends = torch.clamp(starts + block, max=n) - 1
    return starts, ends


def _classify(all_in: Tensor, any_in: Tensor) -> Tensor:
    """Block classes from 'every entry allowed' / 'some entry allowed' booleans."""
    out = torch.full(all_in.shape, PARTIAL, dtype=torch.int8)
    out[~any_in] = EMPTY
    out[all_in] = FULL
    return out


def _check_sizes(q_len: int, kv_len: int) -> None:
    for name, n in (("q_len", q_len), ("kv_len", kv_len)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name}: expected a positive int, got {n!r}")


class Mask:
    """Base class of all masks (True = may attend).

    Subclasses implement :meth:`_allowed` on index grids, and optionally :meth:`_block_map`
    analytically (the default evaluates the mask block by block) and :meth:`_bias`.
    """

    batch_shape: tuple[int, ...] = ()
    """Leading batch dims this mask carries (aligned with the leading batch dims of ``q``;
    each is 1 or equal to the input's); () when the mask is the same for every batch element."""

    has_bias: bool = False
    """True when the mask adds float values to the scores (additive masks, ALiBi)."""

    # --- to implement -------------------------------------------------------------------------
    def _allowed(self, qi: Tensor, kj: Tensor, q_len: int, kv_len: int) -> Tensor:
        """Bool broadcastable to batch_shape + (n, m) for query indices ``qi`` (n, 1) and key
        indices ``kj`` (1, m)."""
        raise NotImplementedError

    def _bias(self, qi: Tensor, kj: Tensor, q_len: int, kv_len: int) -> Tensor | None:
        """Float ([B,] n, m) added to the scores, or None."""
        return None

    def _block_map(self, q_len: int, kv_len: int, block_q: int, block_kv: int) -> Tensor:
        nq = math.ceil(q_len / block_q)
        nk = math.ceil(kv_len / block_kv)
        out = torch.empty(self.batch_shape + (nq, nk), dtype=torch.int8)
        kj = torch.arange(kv_len)[None, :]
        for bi in range(nq):
            q0 = bi * block_q
            q1 = min(q0 + block_q, q_len)
            rows = self._allowed(torch.arange(q0, q1)[:, None], kj, q_len, kv_len)
            rows = rows.expand(self.batch_shape + (q1 - q0, kv_len))
            pad = nk * block_kv - kv_len
            if pad:
                # padding keys must not change the classification: pad with the row's own value
                # for 'all' (True) and for 'any' (False)
                all_in = torch.nn.functional.pad(rows, (0, pad), value=True)
                any_in = torch.nn.functional.pad(rows, (0, pad), value=False)
            else:
                all_in = any_in = rows
            all_b = all_in.unflatten(-1, (nk, block_kv)).all(-1).all(-2)
            any_b = any_in.unflatten(-1, (nk, block_kv)).any(-1).any(-2)
            out[..., bi, :] = _classify(all_b, any_b)
        return out

    # --- public API --------------------------------------------------------------------------
    def materialize(self, q_len: int, kv_len: int) -> Tensor:
        """The mask as a bool tensor of shape batch_shape + (Lq, Lk): (Lq, Lk), or (B, Lq, Lk)
        for per-batch masks."""
        _check_sizes(q_len, kv_len)
        return self.tile(0, q_len, 0, kv_len, q_len, kv_len)

    def tile(self, q0: int, q1: int, k0: int, k1: int, q_len: int, kv_len: int) -> Tensor:
        """Rows ``q0:q1``, columns ``k0:k1`` of the materialized mask:
        batch_shape + (q1-q0, k1-k0) bool."""
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
        EMPTY / PARTIAL / FULL.

        Computed without building the Lq x Lk grid for the structured masks; the last block in
        each direction may be shorter. A block with a score bias is never FULL (it needs the
        bias applied), only PARTIAL or EMPTY.
        """
        _check_sizes(q_len, kv_len)
        for name, b in (("block_q", block_q), ("block_kv", block_kv)):
            if not isinstance(b, int) or b < 1:
                raise ValueError(f"{name}: expected a positive int, got {b!r}")
        bm = self._block_map(q_len, kv_len, block_q, block_kv)
        nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
        bm = bm.expand(self.batch_shape + (nq, nk))
        if self.has_bias:
            bm = torch.where(bm == FULL, torch.tensor(PARTIAL, dtype=torch.int8), bm)
        return bm

    def __and__(self, other: Mask) -> Mask:
        return _And(self, _require_mask(other, "&"))

    def __or__(self, other: Mask) -> Mask:
        return _Or(self, _require_mask(other, "|"))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._repr_fields().items())
        return f"{type(self).__name__}({fields})"

    def _repr_fields(self) -> dict:
        return {}


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
    for x, y in zip(sa, sb):
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

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        ma, mb = self._parts(
            self.a.block_map(q_len, kv_len, block_q, block_kv),
            self.b.block_map(q_len, kv_len, block_q, block_kv),
        )
        full = (ma == FULL) & (mb == FULL)
        empty = (ma == EMPTY) | (mb == EMPTY)
        return _classify(full, ~empty)

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
            self.a.block_map(q_len, kv_len, block_q, block_kv),
            self.b.block_map(q_len, kv_len, block_q, block_kv),
        )
        full = (ma == FULL) | (mb == FULL)
        empty = (ma == EMPTY) & (mb == EMPTY)
        bm = _classify(full, ~empty)
        # two partial blocks may together cover the block: only exact evaluation can tell, and
        # PARTIAL is always a correct (conservative) answer.
        return bm

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
        dmin = ks - qe  # smallest j - i in the block
        dmax = ke - qs  # largest j - i in the block
        any_in = (dmax >= self.lo) & (dmin <= self.hi)
        all_in = (dmin >= self.lo) & (dmax <= self.hi)
        return _classify(all_in, any_in)


class causal(_Band):  # noqa: N801 - lower-case like a function, as users call it
    """Causal mask: query ``i`` may attend to keys ``j <= i`` (after alignment).

    ``alignment="top_left"`` aligns the first query with the first key; ``"bottom_right"``
    aligns the last query with the last key (decoding with a KV cache, Lq < Lk). For Lq = 3,
    Lk = 5::

        top_left        bottom_right
        1 0 0 0 0       1 1 1 0 0
        1 1 0 0 0       1 1 1 1 0
        1 1 1 0 0       1 1 1 1 1
    """

    def __init__(self, alignment: Alignment = "top_left") -> None:
        super().__init__(-math.inf, 0, alignment)

    def _repr_fields(self):
        return {"alignment": self.alignment}


class sliding_window(_Band):  # noqa: N801
    """Sliding window: query ``i`` may attend to keys ``i - left <= j <= i + right``.

    ``right`` defaults to ``left`` (symmetric window); ``sliding_window(w) & causal()`` gives a
    local-causal mask. ``sliding_window(1)`` on 5 x 5::

        1 1 0 0 0
        1 1 1 0 0
        0 1 1 1 0
        0 0 1 1 1
        0 0 0 1 1
    """

    def __init__(self, left: int, right: int | None = None, alignment: Alignment = "top_left"):
        right = left if right is None else right
        for name, w in (("left", left), ("right", right)):
            if not isinstance(w, int) or isinstance(w, bool) or w < 0:
                raise ValueError(f"sliding_window: {name} must be an int >= 0, got {w!r}")
        super().__init__(-left, right, alignment)
        self.left, self.right = left, right

    def _repr_fields(self):
        return {"left": self.left, "right": self.right, "alignment": self.alignment}


def _as_index_tensor(x, name: str, ndim: tuple[int, ...]) -> Tensor:
    t = torch.as_tensor(x)
    if t.is_floating_point() or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name}: expected an integer tensor, got dtype {t.dtype}")
    if t.dim() not in ndim:
        raise ValueError(f"{name}: expected {' or '.join(map(str, ndim))} dims, got shape {tuple(t.shape)}")
    return t.to(torch.long).cpu()


class key_padding(Mask):  # noqa: N801
    """Key padding: in batch element ``b`` only keys ``j < lengths[b]`` are valid.

    ``lengths``: (B,) integer valid-key counts. ``key_padding([3, 1])`` with Lq = 2, Lk = 4::

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
        nq = math.ceil(q_len / block_q)
        return _classify(all_in, any_in)[:, None, :].expand(-1, nq, -1).contiguous()

    def _repr_fields(self):
        return {"lengths": self.lengths.tolist()}


class document(Mask):  # noqa: N801
    """Document (block-diagonal) mask: attend only within the same document.

    ``ids``: document id per position, (L,) or (B, L); ``kv_ids`` for the keys when they differ
    from the queries (defaults to ``ids``). ids ``[0, 0, 1, 1, 1]``::

        1 1 0 0 0
        1 1 0 0 0
        0 0 1 1 1
        0 0 1 1 1
        0 0 1 1 1

    Block maps are exact for ids that are sorted (packed sequences); unsorted ids are handled
    correctly but classify blocks by evaluation.
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

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        self._check_len(q_len, kv_len)
        sorted_q = bool((self.ids[..., 1:] >= self.ids[..., :-1]).all())
        sorted_k = bool((self.kv_ids[..., 1:] >= self.kv_ids[..., :-1]).all())
        if not (sorted_q and sorted_k):
            return super()._block_map(q_len, kv_len, block_q, block_kv)
        qs, qe = _block_edges(q_len, block_q)
        ks, ke = _block_edges(kv_len, block_kv)
        qlo, qhi = self.ids[..., qs][..., :, None], self.ids[..., qe][..., :, None]
        klo, khi = self.kv_ids[..., ks][..., None, :], self.kv_ids[..., ke][..., None, :]
        any_in = (qlo <= khi) & (klo <= qhi)  # id ranges overlap (sorted ids: ranges are dense)
        all_in = (qlo == qhi) & (klo == khi) & (qlo == klo)
        if any_in.any():
            # overlapping id ranges need not share an id (e.g. ids 0,2 vs 1): refine those blocks
            exact = super()._block_map(q_len, kv_len, block_q, block_kv)
            return torch.where(any_in & ~all_in, exact, _classify(all_in, any_in))
        return _classify(all_in, any_in)

    def _repr_fields(self):
        return {"ids": tuple(self.ids.shape)}


class prefix_lm(Mask):  # noqa: N801
    """Prefix-LM mask: keys ``j < prefix_len`` are visible to all queries, the rest causally.

    ``prefix_len``: an int, or (B,) ints per batch element. ``prefix_lm(2)`` on 4 x 4::

        1 1 0 0
        1 1 0 0
        1 1 1 0
        1 1 1 1
    """

    def __init__(self, prefix_len) -> None:
        if isinstance(prefix_len, int) and not isinstance(prefix_len, bool):
            self.prefix = torch.tensor([prefix_len])
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
        pre_full = (ke[None, :] < p) if not self.batch_shape else (ke[None, None, :] < p)
        pre_any = (ks[None, :] < p) if not self.batch_shape else (ks[None, None, :] < p)
        full = (c == FULL) | pre_full
        empty = (c == EMPTY) & ~pre_any
        return _classify(full, ~empty)

    def _repr_fields(self):
        return {"prefix_len": self.prefix.tolist()}


class from_predicate(Mask):  # noqa: N801
    """A mask from a predicate ``fn(b, h, q_idx, kv_idx) -> bool tensor`` (FlexAttention's
    ``mask_mod`` form, True = may attend).

    ``fn`` must be vectorised: it is called with broadcastable index tensors, ``q_idx`` (n, 1),
    ``kv_idx`` (1, m), ``b`` (B, 1, 1) when ``batch_size`` is given (else a 0-d zero) and ``h``
    (B', H, 1, 1) when ``num_heads`` is given (else a 0-d zero); the result must broadcast to
    ([B,] [H,] n, m). Block maps evaluate the predicate block row
    by block row (O(block_q x Lk) memory), so prefer the named masks when one fits.
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
            if n is not None and (not isinstance(n, int) or n < 1):
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
        b = torch.arange(self.batch_size).reshape((-1,) + (1,) * (nb + 1)) if self.batch_size else zero
        h = torch.arange(self.num_heads)[:, None, None] if self.num_heads else zero
        out = self.fn(b, h, qi, kj)
        if not isinstance(out, Tensor) or out.dtype != torch.bool:
            got = out.dtype if isinstance(out, Tensor) else type(out).__name__
            raise TypeError(f"fn: expected the predicate to return a bool tensor, got {got}")
        return out

    def _repr_fields(self):
        return {"fn": getattr(self.fn, "__name__", "fn")}


class from_tensor(Mask):  # noqa: N801
    """A mask from an explicit tensor.

    A bool tensor is True = may attend. A float tensor is *added* to the scores (seed 001's
    ``M``); ``-inf`` entries disallow a key. Shape (..., Lq, Lk): its leading dims line up with
    the *leading* batch dims of the inputs (each 1 or equal). ``attnkit.functional`` first
    right-aligns a tensor given as ``mask=`` (torch broadcasting, e.g. (Lq, Lk) or
    (B, 1, Lq, Lk) for (B, H, Lq, d) inputs) and then wraps it here.
    """

    def __init__(self, t: Tensor) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"mask: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bool and not t.is_floating_point():
            raise TypeError(f"mask: expected a bool or floating tensor, got dtype {t.dtype}")
        if t.dim() < 2:
            raise ValueError(
                f"mask: expected a tensor of shape (..., Lq, Lk), got {tuple(t.shape)}"
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
        return self.t[..., qi[:, 0], :][..., kj[0, :]].cpu()

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
    """ALiBi (Press et al.) as a score bias: ``bias[i, j] = -slope * |i - j|`` (bottom-right
    aligned when Lq != Lk); every key stays allowed. One slope for all heads here; for per-head
    slopes use :func:`alibi_slopes` with a bias per head in ``attnkit.nn``.
    """

    has_bias = True

    def __init__(self, slope: float) -> None:
        if not (isinstance(slope, (int, float)) and math.isfinite(slope)):
            raise ValueError(f"slope: expected a finite number, got {slope!r}")
        self.slope = float(slope)

    def _allowed(self, qi, kj, q_len, kv_len):
        return torch.ones((qi.shape[0], kj.shape[1]), dtype=torch.bool)

    def _bias(self, qi, kj, q_len, kv_len):
        d = (kj - (qi + (kv_len - q_len))).abs().to(torch.float64)
        return -self.slope * d

    def _block_map(self, q_len, kv_len, block_q, block_kv):
        nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
        return torch.full((nq, nk), PARTIAL, dtype=torch.int8)

    def _repr_fields(self):
        return {"slope": self.slope}


def alibi_slopes(num_heads: int) -> Tensor:
    """The ALiBi head slopes of Press et al.: (num_heads,) float64, 2^(-8 k / n) for k = 1..n
    (with the paper's interleaving when n is not a power of two)."""
    if not isinstance(num_heads, int) or num_heads < 1:
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
    **True means ignore**, into an attnkit mask (True = may attend).

    ``[[False, False, True]]`` (ignore the last key) becomes, for any Lq::

        1 1 0
    """
    if not isinstance(m, Tensor):
        raise TypeError(f"key_padding_mask: expected a torch.Tensor, got {type(m).__name__}")
    if m.dtype != torch.bool:
        if not m.is_floating_point():
            raise TypeError(f"key_padding_mask: expected bool or float, got dtype {m.dtype}")
        if m.dim() != 2:
            raise ValueError(f"key_padding_mask: expected (B, Lk), got shape {tuple(m.shape)}")
        return _KeyColumns(m)
    if m.dim() != 2:
        raise ValueError(f"key_padding_mask: expected (B, Lk), got shape {tuple(m.shape)}")
    return _KeyColumns(~m)


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

    def _allowed(self, qi, kj, q_len, kv_len):
        self._check_len(kv_len)
        c = self.cols[:, kj[0, :]][:, None, :]
        c = c if c.dtype == torch.bool else c != -math.inf
        return c.expand(-1, qi.shape[0], -1)

    def _bias(self, qi, kj, q_len, kv_len):
        c = self.cols[:, kj[0, :]][:, None, :]
        c = torch.where(c == -math.inf, torch.zeros((), dtype=c.dtype), c)
        return c.expand(-1, qi.shape[0], -1)


def from_additive(m: Tensor) -> Mask:
    """Convert an additive float mask (added to the scores; ``-inf`` disallows, seed 001's
    ``M``) of shape (Lq, Lk) or (B, Lq, Lk) into a mask object."""
    if not isinstance(m, Tensor) or not m.is_floating_point():
        got = m.dtype if isinstance(m, Tensor) else type(m).__name__
        raise TypeError(f"mask: expected a floating tensor, got {got}")
    return from_tensor(m)


def as_mask(mask: Mask | Tensor | None) -> Mask | None:
    """Normalise a user's ``mask`` argument: a Mask, a tensor (see :class:`from_tensor`), or None."""
    if mask is None or isinstance(mask, Mask):
        return mask
    if isinstance(mask, Tensor):
        return from_tensor(mask)
    raise TypeError(
        f"mask: expected a Mask object, a bool/float torch.Tensor or None, got {type(mask).__name__}"
    )
