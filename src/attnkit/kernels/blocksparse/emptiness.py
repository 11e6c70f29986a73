"""How much of an attention call's score matrix the ``blocksparse`` backend can skip: the
numbers ``auto`` dispatch judges it by (:meth:`BlocksparseBackend.speed_reasons`) and
``attnkit tune`` measures the per-element threshold against (:mod:`attnkit.autotune`), computed
in one place so the tune's sizes are the sizes dispatch compares with.

Shape legend: the mask's block map is ``mask.batch_shape + (nq or 1, nk)``; ``P`` the product
of its batch dims (the mask's elements), ``nq``/``nk`` query/key blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnkit.kernels.call.base import AttentionCall
from attnkit.masks import EMPTY

__all__ = ["EmptyBlocks", "empty_blocks"]


@dataclass(frozen=True)
class EmptyBlocks:
    """The empty (block_q x block_kv) blocks of one call's mask.

    ``every``: the fraction empty in every element of the mask's batch (skipped by shared
    calls); ``each``: the fraction empty per element, on average (skipped only by one SDPA
    call per element and query block); ``calls``: how many such per-element calls there are
    (element x query block with at least one key); ``skipped_per_call``: the score entries
    (summed over the batch dims, heads included) each of those calls skips on average."""

    every: float
    each: float
    calls: int
    skipped_per_call: float


def empty_blocks(call: AttentionCall, block_q: int, block_kv: int) -> EmptyBlocks:
    """:class:`EmptyBlocks` of ``call`` (which has a mask) with the given block sizes, from the
    call's cached block map (no score matrix is built)."""
    if call.mask is None:
        raise ValueError("call: expected a call with a mask, got one without")
    bm = call.block_map(block_q, block_kv)  # mask.batch_shape + (nq or 1, nk)
    nq, nk = math.ceil(call.q_len / block_q), bm.shape[-1]
    empty = (bm == EMPTY).expand(bm.shape[:-2] + (nq, nk)).reshape(-1, nq, nk)  # (P, nq, nk)
    every = float(empty.all(0).float().mean())
    each = float(empty.float().mean())
    calls = max(1, int((~empty).any(-1).sum()))
    skipped = each * call.q_len * call.kv_len * math.prod(call.batch_shape) / calls
    return EmptyBlocks(every, each, calls, skipped)
