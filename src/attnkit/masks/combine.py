"""Combinations of masks: :class:`Intersection` (``a & b``, both allow; biases add) and
:class:`Union` (``a | b``, either allows; refused for masks with a score bias)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.masks.band import Band
from attnkit.masks.base import EMPTY, FULL, PARTIAL, Mask, classify, classify_tile, require_mask

__all__ = ["Intersection", "Union"]


def common_batch(a: Mask, b: Mask) -> tuple[int, ...]:
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
        exact = classify_tile(mask.tile(q0, q1, k0, k1, q_len, kv_len), block_q, block_kv)
        sel = ambiguous[..., qb, c0:c1]
        bm[..., qb, c0:c1] = torch.where(sel, exact[..., 0, :], bm[..., qb, c0:c1])
    return bm


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
        return (None if fa is None else _lift(fa, nb)), (None if fb is None else _lift(fb, nb))

    _parts = _lifted  # older private name

    def _both(self, q_len, kv_len, block_q, block_kv):
        return self._lifted(
            self.a._classes(q_len, kv_len, block_q, block_kv),
            self.b._classes(q_len, kv_len, block_q, block_kv),
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
        if ba is None:
            return bb
        return ba if bb is None else ba + bb

    def as_band(self) -> Band | None:
        ba, bb = self.a.as_band(), self.b.as_band()
        if ba is None or bb is None or ba.alignment != bb.alignment:
            return None
        return Band(max(ba.lo, bb.lo), min(ba.hi, bb.hi), ba.alignment)

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
        return _refine(self, bm, ambiguous, q_len, kv_len, block_q, block_kv)

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
        return _refine(self, bm, ambiguous, q_len, kv_len, block_q, block_kv)

    def __repr__(self) -> str:
        return f"({self.a!r} | {self.b!r})"
