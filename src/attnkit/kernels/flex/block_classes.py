"""Exact block classes (EMPTY / PARTIAL / FULL, :mod:`attnkit.masks.blocks`) of a mask's
allowed part, computed on the call's device with torch ops: no host round-trip, no
``.item()`` / ``.tolist()``, so a CUDA call never waits for the GPU here.

The same classes as :meth:`attnkit.masks.Mask.classes` (tested against it), by mask kind:

- bands (causal, sliding windows, local-causal), key padding, prefix-LM and ALiBi: from the
  block edges (O(nq x nk));
- documents: each query block's ids sorted, every key id searched in them (O(nq x Lk log bq),
  in chunks of :data:`~attnkit.masks.blocks.EVAL_ELEMENTS`), never the Lq x Lk grid;
- tensor masks and torch key-padding masks: the tensor's blocks reduced (the tensor is there);
- predicates: the mask's own host block map (a Python function has no device), then copied.

Combinations: ``&`` / ``|`` combine their parts' classes; a block PARTIAL in both parts may
be EMPTY (``&``) or FULL (``|``) together and is evaluated exactly with the combination's
``mask_mod`` (:mod:`.block_eval`): only the band's partial blocks when a part is a band (known
without reading any data), else every block in chunks.

Shape legend: ``nq = ceil(Lq / bq)``, ``nk = ceil(Lk / bk)``; results are int8, broadcastable
to the mask's batch_shape + (nq, nk).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import masks as M
from attnkit.kernels.flex.block_eval import classify_blocks, reduce_tile, refine
from attnkit.kernels.flex.mods import FlexLayout
from attnkit.masks.base import Intersection, Union
from attnkit.masks.blocks import EMPTY, EVAL_ELEMENTS, FULL, PARTIAL, offset
from attnkit.masks.tensor import KeyColumns

__all__ = ["block_classes"]


def _edges(n: int, block: int, dev) -> tuple[Tensor, Tensor]:
    starts = torch.arange(0, n, block, device=dev)
    return starts, (starts + block).clamp(max=n) - 1


def _band(m: M.Band, lq, lk, bq, bk, dev) -> Tensor:
    qs, qe = _edges(lq, bq, dev)
    ks, ke = _edges(lk, bk, dev)
    off = offset(m.alignment, lq, lk)
    dmin = ks[None, :] - (qe[:, None] + off)
    dmax = ke[None, :] - (qs[:, None] + off)
    lo, hi = m.lo, m.hi  # floats (+-inf) or ints: compared against int tensors exactly
    big = lq + lk + 1
    lo = -big if lo < -big else lo
    hi = big if hi > big else hi
    return classify_blocks((dmin >= lo) & (dmax <= hi), (dmax >= lo) & (dmin <= hi))


def _key_padding(m: M.KeyPadding, lq, lk, bq, bk, dev) -> Tensor:
    ks, ke = _edges(lk, bk, dev)
    n = m.lengths.to(dev)[:, None]
    return classify_blocks(ke[None, :] < n, ks[None, :] < n)[:, None, :]


def _prefix(m: M.PrefixLM, lq, lk, bq, bk, dev) -> Tensor:
    c = _band(M.Causal(m.alignment), lq, lk, bq, bk, dev)
    ks, ke = _edges(lk, bk, dev)
    p = m.prefix.to(dev)
    p = p[:, None, None] if m.batch_shape else p[0]
    full = (c == FULL) | (ke[None, :] < p)
    empty = (c == EMPTY) & ~(ks[None, :] < p)
    return classify_blocks(full, ~empty)


def _blocks(x: Tensor, block: int) -> Tensor:
    """(R, L) -> (R, ceil(L / block), block), the last block padded with its last value (a
    repeat changes neither the set of ids in the block nor whether it holds one id)."""
    pad = -x.shape[-1] % block
    if pad:
        x = torch.cat([x, x[:, -1:].expand(-1, pad)], dim=-1)
    return x.reshape(x.shape[0], -1, block)


def _document(m: M.Document, lq, lk, bq, bk, dev) -> Tensor:
    qids = m.ids.to(dev).reshape(-1, lq)
    kids = m.kv_ids.to(dev).reshape(-1, lk)
    qs = _blocks(qids, bq).sort(-1).values  # (R, nq, bq) sorted per block
    kb = _blocks(kids, bk)  # (R, nk, bk)
    rows, nq, nk = qs.shape[0], qs.shape[1], kb.shape[1]
    keys = kb.reshape(rows, 1, -1)  # (R, 1, nk * bk)
    step = max(1, EVAL_ELEMENTS // max(1, rows * keys.shape[-1]))
    parts = []
    for b0 in range(0, nq, step):
        s = qs[:, b0 : b0 + step]  # (R, c, bq)
        k = keys.expand(-1, s.shape[1], -1).contiguous()
        pos = torch.searchsorted(s, k).clamp_(max=bq - 1)
        hit = torch.gather(s, -1, pos) == k  # key j's id occurs in query block
        parts.append(hit.reshape(rows, s.shape[1], nk, bk).any(-1))
    any_in = torch.cat(parts, dim=1)
    single_q = qs[..., 0] == qs[..., -1]
    single_k = kb.amin(-1) == kb.amax(-1)
    all_in = any_in & single_q[:, :, None] & single_k[:, None, :]
    out = classify_blocks(all_in, any_in)
    return out if m.batch_shape else out[0]


def _tensor(m: M.TensorMask, lq, lk, bq, bk, dev) -> Tensor:
    t = m.t.detach().to(dev)
    return reduce_tile(t if t.dtype == torch.bool else t != -math.inf, bq, bk)


def _columns(m: KeyColumns, lq, lk, bq, bk, dev) -> Tensor:
    c = m.cols.to(dev)
    ok = c if c.dtype == torch.bool else c != -math.inf
    return reduce_tile(ok[:, None, :], 1, bk)


def block_classes(
    mask: M.Mask, q_len: int, kv_len: int, block_q: int, block_kv: int, layout: FlexLayout,
    device: torch.device,
) -> Tensor:  # fmt: skip
    """Exact classes of ``mask``'s allowed part, int8 mask batch_shape + (nq, nk), computed on
    ``device`` (bias ignored: a score bias is applied by the ``score_mod`` on every block)."""
    args = (q_len, kv_len, block_q, block_kv, device)
    if isinstance(mask, (Intersection, Union)):
        band = mask.as_band()
        if band is not None:
            return _band(band, *args)
        nb = len(mask.batch_shape)
        ma = block_classes(mask.a, q_len, kv_len, block_q, block_kv, layout, device)
        mb = block_classes(mask.b, q_len, kv_len, block_q, block_kv, layout, device)
        ma = ma.reshape(ma.shape[:-2] + (1,) * (nb + 2 - ma.dim()) + ma.shape[-2:])
        mb = mb.reshape(mb.shape[:-2] + (1,) * (nb + 2 - mb.dim()) + mb.shape[-2:])
        if isinstance(mask, Intersection):
            bm = classify_blocks((ma == FULL) & (mb == FULL), (ma != EMPTY) & (mb != EMPTY))
        else:
            bm = classify_blocks((ma == FULL) | (mb == FULL), (ma != EMPTY) | (mb != EMPTY))
        bm = bm.expand(mask.batch_shape + bm.shape[-2:])
        ambiguous = ((ma == PARTIAL) & (mb == PARTIAL)).expand(bm.shape)
        return refine(mask, bm, ambiguous, q_len, kv_len, block_q, block_kv, layout, device)
    if isinstance(mask, M.ALiBi):
        nq, nk = math.ceil(q_len / block_q), math.ceil(kv_len / block_kv)
        return torch.full((nq, nk), FULL, dtype=torch.int8, device=device)
    for kind, fn in _LEAVES:
        if isinstance(mask, kind):
            return fn(mask, *args)
    return mask.classes(q_len, kv_len, block_q, block_kv).to(device)  # predicates


_LEAVES = (
    (M.Band, _band),
    (M.KeyPadding, _key_padding),
    (M.PrefixLM, _prefix),
    (M.Document, _document),
    (M.TensorMask, _tensor),
    (KeyColumns, _columns),
)
