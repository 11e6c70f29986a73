"""Explicit tiles in the ``blocksparse`` backend: attention dropout and logit softcapping.

PyTorch's fused CPU kernel has no dropout, so with ``dropout_p`` = p > 0 every tile of the plan
(the same query rows, key ranges and tile masks as the fused path, :mod:`.plans`) is computed
explicitly: scores, the row's softmax over its key range (which covers every non-empty block of
the row, so it is the whole row's softmax), the keep mask of :mod:`.keep`, and the weighted sum
of the values: out = (softmax(s) * keep / (1 - p)) v. :class:`DropoutFn` saves q, k, v, the
output and one logsumexp per row (O(L * d) memory); its backward regenerates every tile's
probabilities and keep mask (FlashAttention's recomputation) and accumulates the gradients of
q, k, v and of learned tile masks in place. Large tiles are cut into row chunks of at most
CHUNK_ENTRIES scores, so the temporaries stay O(chunk), never O(Lq * Lk). The interior blocks
of a ``band`` plan go many to a batched tile (:mod:`.dropout_band`); the arithmetic of a tile is
:mod:`.dropout_math`.

Calls with ``softcap`` take the same tiles (with p = 0 when they have no dropout: nothing is
dropped, no keep mask is drawn), the scaled scores capped before the tile mask is added; sinks
join each row's denominator from the tile's logsumexp (:mod:`.sinks`).

Rows without any allowed key give output 0 and gradient 0 (the plan's ``row_ok``).

Shape legend: ``P`` mask batch elements, ``R`` other batch dims (heads), ``L`` rows (query
positions times the fold G), ``d`` the one width, ``n``/``m`` rows/keys of a tile.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from attnkit.kernels.blocksparse import dropout_band as band
from attnkit.kernels.blocksparse import keep
from attnkit.kernels.blocksparse.dropout_band import Setup
from attnkit.kernels.blocksparse.dropout_math import tile_backward, tile_forward
from attnkit.kernels.blocksparse.plans import BandPlan, Plan
from attnkit.kernels.blocksparse.sinks import cap_scores, sink_forward, sink_grad

CHUNK_ENTRIES = 2**20
"""Most score entries (summed over the batch) of one explicit tile; larger tiles are cut."""

SOFTCAP_CHUNK_ENTRIES = 2**22
"""The same without dropout (softcap only): fewer, larger tensor operations (each a parallel
region); no keep mask is drawn."""

INFERENCE_CHUNK_ENTRIES = 2**24
"""The same when nothing needs the logsumexp (softcap, no backward, no sinks): the fewest
tensor operations, 64 MiB of float32 scores per chunk. Measured (Gemma 2 shape, 4/2 heads of
64, L = 4,096, causal, inference, 2 threads on a loaded 2-core machine): 2**16 entries 24-67 s,
2**18 9-24 s, 2**20 5-10 s, 2**22 3.5-5.5 s, 2**24 2.3-3.1 s."""


@dataclass(frozen=True)
class Tile:
    """Rows r0:r1 (folded) of batch element ``p`` (None = all) against keys lo:hi; ``mask``
    additive (.., n, m) with rows counted from ``m0`` (its row a is row r0 + a - m0)."""

    p: int | None
    r0: int
    r1: int
    lo: int
    hi: int
    mask: Tensor | None = None
    row_ok: Tensor | None = None
    causal: bool = False
    m0: int = 0
    index: int = -1
    """Position of ``mask`` among the plan's learned masks (-1: it learns nothing)."""
    band: tuple[float, float] | None = None
    """Keys i + band[0] <= j <= i + band[1] of row i (absolute positions, never folded)."""


def _tiles(plan: Plan) -> list[Tile]:
    """Every tile of ``plan`` on (P, R, L, d) tensors (a band plan's (N, L, d) as (1, N, L, d))."""
    out, n = [], 0
    for c in plan.calls:
        idx = -1
        if c.learns_mask:
            idx, n = n, n + 1
        if c.hi > c.lo:
            t = Tile(c.p, c.q0, c.q1, c.lo, c.hi, c.mask, c.row_ok, c.is_causal, c.q0, idx, c.band)
            out.append(t)
    if isinstance(plan, BandPlan) and not band.applies(plan):
        rows = plan.block * plan.fold
        for b in range(plan.interior[0], plan.interior[1]):
            lo = plan.start + (b - plan.interior[0]) * plan.block
            out.append(
                Tile(None, b * rows, b * rows + rows, lo, lo + plan.window, plan.mask, m0=b * rows)
            )
    return out


def _chunks(t: Tile, batch: int, entries: int = CHUNK_ENTRIES) -> Iterator[Tile]:
    """``t`` cut into row chunks of at most ``entries`` scores; a causal tile's chunks stop at
    the diagonal (rows a..b-1 need keys lo .. lo + b - 1 - m0 only)."""
    width = t.hi - t.lo
    if t.band is not None:  # keys per row: about the band's width
        width = min(width, int(min(t.band[1] - t.band[0], width)) + 1)
    step = max(1, entries // max(1, batch * width))
    for a in range(t.r0, t.r1, step):
        b = min(t.r1, a + step)
        lo, hi = t.lo, min(t.hi, t.lo + b - t.m0) if t.causal else t.hi
        if t.band is not None:  # rows a..b-1 need keys a + band[0] .. b - 1 + band[1]
            blo, bhi = t.band
            lo = t.lo if blo == -math.inf else max(t.lo, math.ceil(a + blo))
            hi = t.hi if bhi == math.inf else min(t.hi, math.floor(b - 1 + bhi) + 1)
        yield replace(t, r0=a, r1=b, lo=lo, hi=hi)


def _entries(s: Setup) -> int:
    if s.p > 0:
        return CHUNK_ENTRIES
    return SOFTCAP_CHUNK_ENTRIES if s.lse else INFERENCE_CHUNK_ENTRIES


def _sel(t: Tensor, tile: Tile, a: int, b: int) -> Tensor:
    """Rows a:b of the tile's batch element(s) of a 4-D tensor, kept 4-D (P', R, b - a, .)."""
    e = slice(None) if tile.p is None else slice(tile.p, tile.p + 1)
    return t[e, :, a:b]


def _flat(t: Tensor) -> Tensor:
    """(P', R, n, c) -> (P' * R, n, c) (a view when the strides allow)."""
    return t.reshape((-1,) + t.shape[-2:])


def _rows_slice(x: Tensor | None, tile: Tile) -> Tensor | None:
    """Rows r0:r1 of a tile mask or row flag whose row 0 is tile row m0."""
    return None if x is None else x[..., tile.r0 - tile.m0 : tile.r1 - tile.m0, :]


def _drop(s: Setup, tile: Tile) -> Tensor | None:
    """Drop mask of ``tile`` (True = dropped): (P' * R, n, m) bool; None for p = 0."""
    if s.p == 0:
        return None
    r = torch.arange(tile.r0, tile.r1)
    i, g = r // s.fold, r % s.fold
    pe = torch.arange(s.elements) if tile.p is None else torch.tensor([tile.p])
    bh = (pe[:, None] * s.heads + torch.arange(s.heads)) * s.fold  # (P', R)
    rows = keep.row_keys(s.seed, bh[..., None] + g, i)[..., None]  # (P', R, n, 1)
    return _flat(keep.drop_tile(rows, tile.lo, tile.hi, keep.threshold(s.p)))


def _scores(s: Setup, tile: Tile, q: Tensor, k: Tensor, grad: bool = False):
    """(masked scores softcap(q kᵀ · scale) + mask of ``tile``: (P' * R, n, m), -inf where not
    allowed; the softcap's derivative when ``grad``, else None)."""
    qs, ks = _sel(q, tile, tile.r0, tile.r1), _sel(k, tile, tile.lo, tile.hi)
    lead, n, m = qs.shape[:2], qs.shape[-2], ks.shape[-2]
    qf, kt = _flat(qs), _flat(ks).transpose(-2, -1)
    mask = _rows_slice(tile.mask, tile)
    dcap = None
    if s.softcap is not None:  # q scaled by scale / c first: (n, d) instead of (n, m)
        sc = torch.bmm(qf * (s.scale / s.softcap), kt)
        dcap = cap_scores(sc, s.softcap, grad)
        if mask is not None:
            sc.view(lead + (n, m)).add_(mask.detach())
    elif mask is None:
        sc = torch.bmm(qf, kt).mul_(s.scale)
    else:
        sc = torch.empty((qf.shape[0], n, m), dtype=q.dtype)  # never a view of the mask
        sc.view(lead + (n, m)).copy_(mask.detach())
        sc.baddbmm_(qf, kt, alpha=s.scale)
    if tile.band is not None:  # only the first and last n columns can hold disallowed keys
        _band_edges(sc, tile, n, m)
    if tile.causal:  # top-left inside the tile (a document & causal call, never folded):
        r = torch.arange(tile.r0 - tile.m0, tile.r1 - tile.m0)[:, None]  # only the columns
        c0 = tile.r0 - tile.m0 + 1  # right of the chunk's first row hold disallowed entries
        if c0 < m:
            sc[:, :, c0:].masked_fill_(torch.arange(c0, m) > r, -math.inf)
    return sc, dcap


def _band_edges(sc: Tensor, tile: Tile, n: int, m: int) -> None:
    """Set to -inf the entries of a band tile's chunk (rows r0:r1, keys lo:lo + m) outside the
    band: row i's keys before i + band[0] lie in the first n columns, those after i + band[1]
    in the last n (the chunk's key range follows the band, :func:`_chunks`)."""
    blo, bhi = tile.band
    i = torch.arange(tile.r0, tile.r1)[:, None]
    w = min(m, n)
    if blo != -math.inf:
        j = tile.lo + torch.arange(w)
        sc[:, :, :w].masked_fill_(j < i + blo, -math.inf)
    if bhi != math.inf:
        j = tile.lo + m - w + torch.arange(w)
        sc[:, :, m - w :].masked_fill_(j > i + bhi, -math.inf)


def dropout_forward(s: Setup, plan: Plan, q: Tensor, k: Tensor, v: Tensor, sinks=None):
    """q (P, R, L, d), k, v (P, R, Lk, d), sinks (P, R, L, 1) or None -> (output (P, R, L, d),
    logsumexp (P, R, L, 1), with the sinks)."""
    out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:-1] + (1,), math.inf, dtype=q.dtype, device=q.device)
    c = 1.0 / (1.0 - s.p)
    for whole in _tiles(plan):
        for t in _chunks(whole, q.shape[1] * (q.shape[0] if whole.p is None else 1), _entries(s)):
            vf = _flat(_sel(v, t, t.lo, t.hi))
            o, m = tile_forward(_scores(s, t, q, k)[0], _drop(s, t), vf, c, s.lse)
            if sinks is not None:
                o, m = sink_forward(o, m[..., 0], _flat(_sel(sinks, t, t.r0, t.r1))[..., 0])
                m = m[..., None]
            ok = _rows_slice(t.row_ok, t)
            dst = _sel(out, t, t.r0, t.r1)
            o = o.view(dst.shape)
            dst.copy_(o if ok is None else o * ok)
            if m is not None:
                _sel(lse, t, t.r0, t.r1).copy_(m.view(dst.shape[:-1] + (1,)))
    if band.applies(plan):
        band.forward(s, plan, q, k, v, out, lse, sinks)
    return out, lse


def dropout_backward(s: Setup, plan: Plan, go: Tensor, q, k, v, out, lse, masks: list, sinks=None):
    """Gradients (gq, gk, gv, [grad of each learned tile mask], grad of sinks or None) from
    the saved tensors."""
    gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    gs = None if sinks is None else torch.zeros_like(sinks)
    gmasks = [torch.zeros_like(m) for m in masks]
    c = 1.0 / (1.0 - s.p)
    for whole in _tiles(plan):
        for t in _chunks(whole, q.shape[1] * (q.shape[0] if whole.p is None else 1), _entries(s)):
            g = _sel(go, t, t.r0, t.r1)
            ok = _rows_slice(t.row_ok, t)
            if ok is not None:
                g = g * ok
            d = _flat((g * _sel(out, t, t.r0, t.r1)).sum(-1, keepdim=True))  # rowsum(dO * O)
            qs, ks, vs = _sel(q, t, t.r0, t.r1), _sel(k, t, t.lo, t.hi), _sel(v, t, t.lo, t.hi)
            (sc, dcap), lse_t = _scores(s, t, q, k, True), _flat(_sel(lse, t, t.r0, t.r1))
            ds, dq, dk, dv = tile_backward(
                sc, lse_t, _drop(s, t), _flat(g) * c, d, _flat(qs), _flat(ks), _flat(vs), dcap
            )
            if gs is not None:
                sk = _flat(_sel(sinks, t, t.r0, t.r1))
                _sel(gs, t, t.r0, t.r1).add_(sink_grad(sk, lse_t, d).view(g.shape[:-1] + (1,)))
            _sel(gv, t, t.lo, t.hi).add_(dv.view(vs.shape))
            _sel(gq, t, t.r0, t.r1).add_(dq.view(g.shape[:-1] + ks.shape[-1:]), alpha=s.scale)
            _sel(gk, t, t.lo, t.hi).add_(dk.view(ks.shape), alpha=s.scale)
            if t.index >= 0:
                dst = gmasks[t.index][..., t.r0 - t.m0 : t.r1 - t.m0, :]
                dst += ds.view(g.shape[:-1] + ds.shape[-1:]).sum_to_size(dst.shape)
    if band.applies(plan):
        band.backward(s, plan, go, q, k, v, out, lse, gq, gk, gv, sinks, gs)
    return gq, gk, gv, gmasks, gs


class DropoutFn(torch.autograd.Function):
    """(softmax(softcap(q kᵀ · scale) + tile masks) * keep / (1 - p)) v by ``plan``: q, k, v
    in the plan's shape; ``sinks`` (rows, 1) or None; extra inputs: the plan's learned tile
    masks (their gradients are returned)."""

    @staticmethod
    def forward(ctx, q, k, v, plan: Plan, setup: Setup, sinks, *masks):
        out, lse = dropout_forward(setup, plan, q, k, v, sinks)
        ctx.plan, ctx.setup, ctx.has_sinks = plan, setup, sinks is not None
        extra = (sinks,) if sinks is not None else ()
        ctx.save_for_backward(q, k, v, out, lse, *extra, *masks)
        return out

    @staticmethod
    def backward(ctx, go):
        q, k, v, out, lse, *masks = ctx.saved_tensors
        sinks = masks.pop(0) if ctx.has_sinks else None
        gq, gk, gv, gmasks, gs = dropout_backward(
            ctx.setup, ctx.plan, go, q, k, v, out, lse, masks, sinks
        )
        return (gq, gk, gv, None, None, gs, *gmasks)
