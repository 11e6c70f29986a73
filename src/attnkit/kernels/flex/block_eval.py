"""A mask's ``mask_mod`` (:mod:`.mods`) evaluated on blocks, on the call's device: block classes
from evaluated entries, and the exact refinement of the blocks a combination leaves ambiguous.

``a & b`` (``a | b``) is FULL (EMPTY) where its parts' classes say so; a block PARTIAL in both
parts can be anything and is evaluated exactly (:func:`refine`). When a part is a band (causal,
windows: its partial blocks are known from the geometry alone, without reading any data), only
those blocks are evaluated, O(band blocks x bq x bk); otherwise every block, in chunks of block
rows of at most :data:`~attnkit.masks.blocks.EVAL_ELEMENTS` entries. No host read-back either
way: the positions of a band's partial blocks come from the host, the data stays on the device.

Shape legend: ``nb`` the call's batch dims; ``P`` evaluated blocks; ``bq``, ``bk`` block sizes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.kernels.flex.mods import FlexLayout, MaskMod, allowed_mod
from attnkit.masks.blocks import EVAL_ELEMENTS, FULL, PARTIAL

__all__ = ["classify_blocks", "evaluate", "reduce_tile", "refine"]


def classify_blocks(all_in: Tensor, any_in: Tensor) -> Tensor:
    """int8 classes from 'every entry allowed' / 'some entry allowed' (on their device)."""
    all_in, any_in = torch.broadcast_tensors(all_in, any_in)
    out = any_in.to(torch.int8) * PARTIAL
    return torch.where(all_in, torch.full((), FULL, dtype=torch.int8, device=out.device), out)


def reduce_tile(ok: Tensor, bq: int, bk: int) -> Tensor:
    """Classes of a bool (..., n, m) cut into (bq x bk) blocks from the top-left corner."""
    n, m = ok.shape[-2:]
    pq, pk = -n % bq, -m % bk
    pad = torch.nn.functional.pad
    all_in = pad(ok, (0, pk, 0, pq), value=True) if pq or pk else ok
    any_in = pad(ok, (0, pk, 0, pq), value=False) if pq or pk else ok
    shape = ok.shape[:-2] + ((n + pq) // bq, bq, (m + pk) // bk, bk)
    return classify_blocks(
        all_in.reshape(shape).all(-1).all(-2), any_in.reshape(shape).any(-1).any(-2)
    )


def evaluate(
    mod: MaskMod, batch_shape: tuple[int, ...], layout: FlexLayout, qi: Tensor, kj: Tensor
) -> Tensor:
    """``mod`` on index tensors ``qi``, ``kj`` (broadcastable, any trailing shape T): bool
    batch_shape + T, the mask's batch dims read at Flex's b / h indices."""
    dev, t = qi.device, max(qi.dim(), kj.dim())
    nb = len(batch_shape)
    idx = {"b": torch.zeros((), dtype=torch.long, device=dev)}
    idx["h"] = idx["b"]
    for i, size in enumerate(batch_shape):
        shape = [1] * (nb + t)
        shape[i] = size
        idx[layout.dims[i]] = torch.arange(size, device=dev).reshape(shape)
    q = qi.reshape((1,) * nb + tuple(qi.shape))
    k = kj.reshape((1,) * nb + tuple(kj.shape))
    out = mod(idx["b"], idx["h"], q, k)
    return out.expand(batch_shape + torch.broadcast_shapes(qi.shape, kj.shape))


def _band_partials(mask, lq, lk, bq, bk) -> Tensor | None:
    """(P, 2) int64 (query block, key block) of the partial blocks of a band part of ``mask``
    (host, from the geometry), or None when no part is a band."""
    for part in mask.parts:
        band = part.as_band()
        if band is not None:
            classes = band.classes(lq, lk, bq, bk)
            return (classes == PARTIAL).nonzero()
    return None


def _exact_blocks(mod, mask, layout, pos: Tensor, lq, lk, bq, bk) -> Tensor:
    """Exact classes of the blocks at ``pos`` (P, 2) on the device: batch_shape + (P,)."""
    qi = pos[:, :1, None] * bq + torch.arange(bq, device=pos.device)[None, :, None]
    kj = pos[:, 1:, None] * bk + torch.arange(bk, device=pos.device)[None, None, :]
    valid = (qi < lq) & (kj < lk)  # (P, bq, bk): the last blocks may be shorter
    ok = evaluate(mod, mask.batch_shape, layout, qi.clamp(max=lq - 1), kj.clamp(max=lk - 1))
    all_in = (ok | ~valid).flatten(-2).all(-1)
    any_in = (ok & valid).flatten(-2).any(-1)
    return classify_blocks(all_in, any_in)


def refine(mask, bm: Tensor, ambiguous: Tensor, lq, lk, bq, bk, layout: FlexLayout, dev) -> Tensor:
    """``bm`` (batch_shape + (nq, nk)) with the ``ambiguous`` blocks replaced by their exact
    classes (the combination ``mask`` evaluated with its ``mask_mod``)."""
    mod = allowed_mod(mask, lq, lk, layout, dev)
    if mod is None:  # every key allowed (biases only): no block is ambiguous
        return bm
    pos = _band_partials(mask, lq, lk, bq, bk)
    if pos is not None:  # ambiguous blocks are among the band's partial blocks
        if pos.shape[0] == 0:
            return bm
        step = max(1, EVAL_ELEMENTS // max(1, bq * bk * math.prod(mask.batch_shape)))
        bm = bm.clone()
        for p0 in range(0, pos.shape[0], step):
            p = pos[p0 : p0 + step].to(dev)
            exact = _exact_blocks(mod, mask, layout, p, lq, lk, bq, bk)
            cur = bm[..., p[:, 0], p[:, 1]]
            bm[..., p[:, 0], p[:, 1]] = torch.where(ambiguous[..., p[:, 0], p[:, 1]], exact, cur)
        return bm
    nq = bm.shape[-2]
    step = max(1, EVAL_ELEMENTS // max(1, bq * lk * max(1, math.prod(mask.batch_shape))))
    kj = torch.arange(lk, device=dev)[None, :]
    parts = []
    for b0 in range(0, nq, step):
        qi = torch.arange(b0 * bq, min((b0 + step) * bq, lq), device=dev)[:, None]
        parts.append(reduce_tile(evaluate(mod, mask.batch_shape, layout, qi, kj), bq, bk))
    return torch.where(ambiguous, torch.cat(parts, dim=-2), bm)
