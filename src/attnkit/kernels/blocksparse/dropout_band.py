"""Dropout on the interior blocks of a ``band`` plan, many blocks per batched tile.

Every interior query block of a band plan has the same shape (``block * fold`` rows against a
``window`` of keys starting ``block`` keys after the previous block's) and the same band mask,
so blocks b0:b1 form one batched tile: q blocks (N * n, rows, d) against key windows (a strided
``unfold`` view of k and v, copied once per tile for the matmuls). Few large tiles keep the
number of tensor operations small: with many small ones, each a parallel region, a CPU shared
with other processes stalls at every region's barrier. At most BAND_CHUNK scores per tile.

The keep mask is the one of :mod:`~attnkit.kernels.blocksparse.keep`, block b reading keys
``start + (b - b0) * block`` onwards (which needs ``block`` divisible by 4, the keys per hash;
other plans take the per-block tiles of :mod:`~attnkit.kernels.blocksparse.dropout`).

Shape legend: ``N`` batch-heads, ``n`` blocks of a tile, ``rows`` = block * fold, ``w`` window,
``L`` rows of q (positions times the fold), ``d`` width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.kernels.blocksparse import keep
from attnkit.kernels.blocksparse.dropout_math import tile_backward, tile_forward
from attnkit.kernels.blocksparse.plans import BandPlan, Plan
from attnkit.kernels.blocksparse.sinks import cap_scores, sink_forward, sink_grad

BAND_CHUNK = 2**22
"""Most score entries (over the batch-heads) of one batched tile of band blocks."""


@dataclass(frozen=True)
class Setup:
    """What every tile needs: scale, p (0: no dropout, no keep mask), seed, the fold G, the
    key-row layout (P, R) and the softcap (None: none)."""

    scale: float
    p: float
    seed: int
    fold: int
    elements: int
    heads: int
    softcap: float | None = None
    lse: bool = True
    """Keep each row's logsumexp (False: inference without sinks, where nothing reads it)."""


def applies(plan: Plan) -> bool:
    """True for a band plan with interior blocks whose block size the hash groups divide."""
    return isinstance(plan, BandPlan) and plan.interior_blocks > 0 and plan.block % 4 == 0


def _ranges(plan: BandPlan, heads: int) -> list[tuple[int, int]]:
    rows = plan.block * plan.fold
    per = max(1, BAND_CHUNK // max(1, heads * rows * plan.window))
    b0, b1 = plan.interior
    return [(a, min(b1, a + per)) for a in range(b0, b1, per)]


def _windows(plan: BandPlan, t: Tensor, lo0: int, n: int) -> Tensor:
    """k or v (N, Lk, d) -> the windows of n blocks from key lo0, copied: (N * n, w, d)."""
    w, bq = plan.window, plan.block
    win = t[:, lo0 : lo0 + (n - 1) * bq + w].unfold(1, w, bq).transpose(-1, -2)
    return win.reshape((-1, w, t.shape[-1]))


def _fold_into(plan: BandPlan, g: Tensor, gw: Tensor, lo0: int, n: int) -> None:
    """Add window gradients gw (N * n, w, d) into g (N, Lk, d) (windows overlap)."""
    w, bq = plan.window, plan.block
    gw = gw.view(g.shape[0], n, w, g.shape[-1])
    sn, sl, sd = g.stride()
    for c in range(math.ceil(w / bq)):  # rows c*bq.. of every window: keys lo0 + (b + c) * bq..
        t = min(bq, w - c * bq)
        dst = g.as_strided(
            (g.shape[0], n, t, g.shape[2]),
            (sn, bq * sl, sl, sd),
            g.storage_offset() + (lo0 + c * bq) * sl,
        )
        dst += gw[:, :, c * bq : c * bq + t]


def _scores(s: Setup, plan: BandPlan, qf: Tensor, kf: Tensor, grad: bool = False):
    """(softcap(q kᵀ · scale) + the band mask: (N * n, rows, w); the softcap's derivative when
    ``grad``, else None)."""
    if s.softcap is not None:
        sc = torch.bmm(qf * (s.scale / s.softcap), kf.transpose(-2, -1))
        dcap = cap_scores(sc, s.softcap, grad)
        return sc.add_(plan.mask[0]), dcap
    sc = torch.empty(qf.shape[0], qf.shape[1], kf.shape[1], dtype=qf.dtype)
    sc.copy_(plan.mask[0])  # (1, rows, w) broadcast
    return sc.baddbmm_(qf, kf.transpose(-2, -1), alpha=s.scale), None


def _drop(s: Setup, plan: BandPlan, b0: int, b1: int, lo0: int, heads: int) -> Tensor | None:
    """Drop mask of blocks b0:b1: (N * n, rows, w) bool; None for p = 0."""
    if s.p == 0:
        return None
    rows, n = plan.block * plan.fold, b1 - b0
    r = torch.arange(b0 * rows, b1 * rows)
    bh = torch.arange(heads)[:, None] * s.fold + r % s.fold  # (N, n * rows)
    rk = keep.row_keys(s.seed, bh, r // s.fold).view(heads, n, rows, 1)
    shift = (torch.arange(n) * (plan.block // 4))[:, None, None]
    drop = keep.drop_tile(rk, lo0, lo0 + plan.window, keep.threshold(s.p), shift)
    return drop.view(-1, rows, plan.window)


def forward(s: Setup, plan: BandPlan, q, k, v, out: Tensor, lse: Tensor, sinks=None):
    """Write the interior blocks' output and logsumexp into ``out`` (1, N, L, d) and ``lse``
    (1, N, L, 1); q (1, N, L, d), k, v (1, N, Lk, d), sinks (1, N, L, 1) or None."""
    heads, rows, c = q.shape[1], plan.block * plan.fold, 1.0 / (1.0 - s.p)
    for b0, b1 in _ranges(plan, heads):
        n, lo0 = b1 - b0, plan.start + (b0 - plan.interior[0]) * plan.block
        qf = q[0, :, b0 * rows : b1 * rows].reshape(-1, rows, q.shape[-1])
        kf, vf = _windows(plan, k[0], lo0, n), _windows(plan, v[0], lo0, n)
        drop = _drop(s, plan, b0, b1, lo0, heads)
        o, m = tile_forward(_scores(s, plan, qf, kf)[0], drop, vf, c, s.lse)
        if m is not None and sinks is not None:
            sk = sinks[0, :, b0 * rows : b1 * rows].reshape(-1, rows)
            o, m = sink_forward(o, m[..., 0], sk)
            m = m[..., None]
        out[0, :, b0 * rows : b1 * rows] = o.view(heads, n * rows, -1)
        if m is not None:
            lse[0, :, b0 * rows : b1 * rows] = m.view(heads, n * rows, 1)


def backward(
    s: Setup, plan: BandPlan, go: Tensor, q, k, v, out, lse, gq, gk, gv, sinks=None, gs=None
) -> None:
    """Accumulate the interior blocks' gradients into gq, gk, gv (shaped like q, k, v) and the
    sinks' into ``gs`` (shaped like ``sinks``)."""
    heads, rows, c = q.shape[1], plan.block * plan.fold, 1.0 / (1.0 - s.p)
    for b0, b1 in _ranges(plan, heads):
        n, lo0 = b1 - b0, plan.start + (b0 - plan.interior[0]) * plan.block
        sl = slice(b0 * rows, b1 * rows)
        qf = q[0, :, sl].reshape(-1, rows, q.shape[-1])
        kf, vf = _windows(plan, k[0], lo0, n), _windows(plan, v[0], lo0, n)
        g = go[0, :, sl].reshape(-1, rows, go.shape[-1])
        d = (g * out[0, :, sl].reshape(g.shape)).sum(-1, keepdim=True)
        (sc, dcap), lse_t = _scores(s, plan, qf, kf, True), lse[0, :, sl].reshape(-1, rows, 1)
        _, dq, dk, dv = tile_backward(
            sc, lse_t, _drop(s, plan, b0, b1, lo0, heads), g * c, d, qf, kf, vf, dcap
        )
        if gs is not None:
            sk = sinks[0, :, sl].reshape(-1, rows, 1)
            gs[0, :, sl] += sink_grad(sk, lse_t, d).view(heads, n * rows, 1)
        gq[0, :, sl] += dq.view(heads, n * rows, -1).mul_(s.scale)
        _fold_into(plan, gk[0], dk.mul_(s.scale), lo0, n)
        _fold_into(plan, gv[0], dv, lo0, n)
