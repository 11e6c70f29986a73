"""The arithmetic of one explicit dropout tile, shared by the ``blocksparse`` dropout paths.

A tile is a batch of score blocks in flattened form: scores ``s`` (B, n, m) (already scaled and
masked: -inf where not allowed), the drop mask (B, n, m) bool (True = dropped), values (B, m, d).
With c = 1 / (1 - p), P = softmax(s) row by row and M = keep * c:

    out = (P * M) v                        (the forward, plus the row logsumexp)
    dV = (P * M)ᵀ dO;  dP = M * (dO vᵀ);  dS = P * (dP - rowsum(dO * out))

(rowsum(dP * P) = rowsum(dO * out) since out = (P * M) v). Every tensor the size of the tile is
modified in place where it can be: each pass over a tile costs as much as a matmul here.

Shape legend: ``B`` batch of blocks, ``n`` rows, ``m`` keys, ``d`` width.
"""

from __future__ import annotations

import torch
from torch import Tensor


def tile_forward(
    s: Tensor, drop: Tensor | None, v: Tensor, c: float, lse: bool = True
) -> tuple[Tensor, Tensor | None]:
    """(output (B, n, d), logsumexp (B, n, 1)); ``s`` is consumed (overwritten); ``drop``
    None: nothing dropped (p = 0, c = 1). Without ``lse`` (no backward, no sinks) and without
    dropout the logsumexp is None and the softmax is torch's own (one pass per row)."""
    if not lse and drop is None:
        return torch.bmm(torch.softmax(s, -1), v), None
    m = s.amax(-1, keepdim=True)
    total = s.sub_(m).exp_().sum(-1, keepdim=True)
    if drop is not None:
        s.masked_fill_(drop, 0.0)
    out = torch.bmm(s, v).mul_(total.reciprocal().mul_(c))
    return out, m.add_(total.log_())


def tile_backward(
    s: Tensor,
    lse: Tensor,
    drop: Tensor | None,
    gc: Tensor,
    d: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dcap: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dS (B, n, m), dq (B, n, d) unscaled, dk (B, m, d) unscaled, dv (B, m, d)) from the
    recomputed scores ``s`` (consumed), the forward's ``lse`` (B, n, 1), ``gc`` = c * dO
    (B, n, d) and ``d`` = rowsum(dO * out) (B, n, 1); dq and dk still need the score scale.
    ``dcap`` (B, n, m): the softcap's derivative 1 - tanh², applied to dS for dq and dk only
    (dS itself is the gradient of an additive mask, added after the cap)."""
    p = s.sub_(lse).exp_()
    pd = p if drop is None else p.masked_fill(drop, 0.0)
    dv = torch.bmm(pd.transpose(-2, -1), gc)
    dp = torch.bmm(gc, v.transpose(-2, -1))
    ds = (dp if drop is None else dp.masked_fill_(drop, 0.0)).sub_(d).mul_(p)
    dsr = ds if dcap is None else ds * dcap
    return ds, torch.bmm(dsr, k), torch.bmm(dsr.transpose(-2, -1), q), dv
