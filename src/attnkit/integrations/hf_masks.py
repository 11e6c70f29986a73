"""transformers' mask arguments recovered as attnkit mask objects (used by
:mod:`attnkit.integrations.transformers`; imports transformers, so only that module imports it).

transformers builds every mask from a *mask function* ``fn(batch_idx, head_idx, q_idx, kv_idx)``
(True = may attend) made of small closures from ``transformers.masking_utils``: the causal and
bidirectional functions, the sliding-window overlays, the padding function, the packed-sequence
functions and ``and_masks`` / ``or_masks``. :func:`recover` walks that closure tree (each closure
recognised by :func:`~attnkit.integrations.hf_closures.classify`) and rebuilds it from the pieces
of :mod:`~attnkit.integrations.hf_mask_nodes`, attnkit's structured masks, whose block maps are
exact and cheap:

==========================================  =================================================
transformers                                attnkit
==========================================  =================================================
``causal_mask_function``                    :class:`~attnkit.masks.Causal` (a band)
``sliding_window_overlay(w)``               band ``-(w-1) <= j - i`` (with causal:
                                            :class:`~attnkit.masks.SlidingWindow` ``(w-1, 0)``)
``sliding_window_bidirectional_overlay(w)`` band ``|i - j| <= w``
``bidirectional_mask_function``             nothing to mask
2-D ``attention_mask`` (padding)            :class:`~attnkit.masks.KeyPadding` (right padding)
                                            or key columns (any other pattern)
packed ``position_ids``                     :class:`~attnkit.masks.Document` ``&`` the band
``and_masks`` / ``or_masks``                ``&`` / ``|``
anything else                               :class:`~attnkit.masks.Predicate` (exact, block map
                                            cached per shape; :class:`UnrecognisedMaskWarning`)
==========================================  =================================================

Positions: transformers gives query ``i`` the position ``q_offset + i`` and key ``j`` the
position ``kv_offset + j`` (a KV cache: ``q_offset`` = cached tokens; a sliding-window cache
also drops keys, ``kv_offset`` > 0). A band on positions ``lo <= kv_pos - q_pos <= hi`` is the
band ``lo + s <= j - i <= hi + s`` on indices with ``s = q_offset - kv_offset``; with a plain
cache ``s = Lk - Lq``, which is attnkit's ``alignment="bottom_right"``.

Mask objects are reused across forward calls with the same structure (an LRU keyed by the
structure and the bytes of its data), so their block maps and kernel plans are computed once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from attnkit.integrations.hf_closures import classify
from attnkit.integrations.hf_mask_nodes import (
    ALL,
    INF,
    Ctx,
    Node,
    PosBand,
    UnrecognisedMaskWarning,
    as_node,
    combine,
    packed_node,
    padding_node,
    predicate,
)
from attnkit.masks import LRUCache, Mask

__all__ = ["HFMask", "UnrecognisedMaskWarning", "recover"]


@dataclass(eq=False)
class HFMask:
    """What attnkit's mask function hands to the model (and the model to every attention
    layer): an attnkit mask for scores of shape (B, H, Lq, Lk).

    ``mask`` is None when every key is allowed; ``q_len``/``kv_len`` are the lengths it was
    built for (the attention function checks them); ``structure`` says what was recovered,
    e.g. ``"band[-3, 0] & key padding"``."""

    mask: Mask | None
    batch: int
    q_len: int
    kv_len: int
    structure: str

    def __repr__(self) -> str:
        return (
            f"HFMask({self.structure}, B={self.batch}, Lq={self.q_len}, Lk={self.kv_len}, "
            f"mask={self.mask!r})"
        )


def _positions_consecutive(psm: Tensor, pos: Tensor) -> bool:
    """True when, inside every packed sequence, positions go up by 1 per token (so differences
    of positions equal differences of indices)."""
    if psm.shape != pos.shape or psm.dim() != 2:
        return False
    same = psm[:, 1:] == psm[:, :-1]
    step = (pos[:, 1:] - pos[:, :-1]) == 1
    return bool((step | ~same).all())


def build(fn: Callable, ctx: Ctx, packed: Tensor | None = None) -> PosBand | Node | None:
    """The node for mask function ``fn`` on ``ctx``. ``packed``: the packed-sequence ids of a
    sibling ``packed_sequence_mask_function`` (for remapped positions)."""
    kind, v = classify(fn)
    if kind == "causal":
        return PosBand(-INF, 0)
    if kind == "all":
        return ALL  # q_idx >= 0 holds for every query position
    if kind == "window":
        w = v["sliding_window"]
        if not isinstance(w, int) or isinstance(w, bool):
            return predicate(fn, ctx, "has a non-int window")
        return PosBand(-(w - 1), INF)
    if kind == "window_bi":
        w = v["sliding_window"]
        if not isinstance(w, int) or isinstance(w, bool):
            return predicate(fn, ctx, "has a non-int window")
        return PosBand(-w, w)
    if kind == "padding":
        return padding_node(v["padding_mask"], ctx)
    if kind == "packed":
        node = packed_node(v["packed_sequence_mask"], ctx)
        return node if node is not None else predicate(fn, ctx, "does not fit the lengths")
    if kind == "remap":
        return _remap(fn, v, ctx, packed)
    if kind == "offsets":
        q, k = v["q_offset"], v["kv_offset"]
        inner = Ctx(ctx.batch, ctx.q_len, ctx.kv_len, ctx.q_off + int(q), ctx.kv_off + int(k))
        return as_node(build(v["mask_function"], inner), inner)
    if kind in ("and", "or"):
        fns = v["mask_functions"]
        sib = None
        if kind == "and":  # packed sequences: and_masks(packed ids, remapped positions)
            for f in fns:
                k2, v2 = classify(f)
                if k2 == "packed":
                    sib = v2["packed_sequence_mask"]
        parts = [build(f, ctx, sib) for f in fns]
        return combine(kind, parts, ctx)
    return predicate(fn, ctx, "is not one attnkit recognises")


def _remap(fn: Callable, v: dict, ctx: Ctx, packed: Tensor | None):
    """``mask_function`` on per-sequence positions: inside one packed sequence (the sibling
    Document mask restricts to it) a band on positions is the same band on indices."""
    pos = v["position_ids"]
    if not isinstance(pos, Tensor) or pos.dim() != 2:
        return predicate(fn, ctx, "has position_ids attnkit cannot read")
    pos = pos.detach().cpu()
    ok = (
        isinstance(packed, Tensor)
        and ctx.q_off == 0
        and ctx.kv_off == 0
        and ctx.q_len == ctx.kv_len == pos.shape[-1]
        and _positions_consecutive(packed.detach().cpu().expand_as(pos), pos)
    )
    if ok:
        inner = build(v["mask_function"], Ctx(ctx.batch, ctx.q_len, ctx.kv_len, 0, 0))
        if isinstance(inner, PosBand):
            return inner
        if inner is ALL and bool((pos >= 0).all()):
            return ALL
    return predicate(fn, ctx, "remaps positions in a way attnkit cannot restate")


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
_REUSE = LRUCache("transformers masks", 64)


def recover(
    mask_function: Callable,
    padding: Tensor | None,
    batch: int,
    q_len: int,
    kv_len: int,
    q_off: int = 0,
    kv_off: int = 0,
) -> HFMask:
    """The attnkit mask equal to transformers' ``mask_function`` ``&`` the 2-D ``padding``
    mask on (batch, Lq, Lk), with query i at position q_off + i and key j at kv_off + j."""
    ctx = Ctx(int(batch), int(q_len), int(kv_len), int(q_off), int(kv_off))
    node = combine("and", [build(mask_function, ctx), padding_node(padding, ctx)], ctx)
    node = as_node(node, ctx)
    if node is ALL:
        return HFMask(None, ctx.batch, ctx.q_len, ctx.kv_len, "no mask (every key allowed)")
    mask = node.mask
    if node.key is not None:
        key = (node.key, ctx)
        hit = _REUSE.get(key)
        mask = hit if hit is not None else _REUSE.put(key, mask)
    return HFMask(mask, ctx.batch, ctx.q_len, ctx.kv_len, node.label)
