"""transformers' mask arguments recovered as attnkit mask objects (used by
:mod:`attnkit.integrations.transformers`; imports transformers, so only that module imports it).

transformers builds every mask from a *mask function* ``fn(batch_idx, head_idx, q_idx, kv_idx)``
(True = may attend) made of small closures from ``transformers.masking_utils``: the causal and
bidirectional functions, the sliding-window overlays, the padding function, the packed-sequence
functions and ``and_masks`` / ``or_masks``. :func:`recover` walks that closure tree (recognising
each closure by its code object and reading its captured values) and rebuilds it from attnkit's
structured masks, whose block maps are exact and cheap:

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

import hashlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import masking_utils as mu

from attnkit.masks import (
    Band,
    Causal,
    Document,
    KeyPadding,
    LRUCache,
    Mask,
    Predicate,
    SlidingWindow,
    from_key_padding_mask,
)

__all__ = ["HFMask", "UnrecognisedMaskWarning", "recover"]

INF = math.inf


class UnrecognisedMaskWarning(UserWarning):
    """A transformers mask function attnkit does not know: it is evaluated exactly through
    :class:`~attnkit.masks.Predicate` (block map cost O(Lq * Lk) per shape, cached)."""


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


# ---------------------------------------------------------------------------------------------
# recognising transformers' closures
# ---------------------------------------------------------------------------------------------
def _kinds() -> dict:
    """Code object -> (kind, names of the captured values we read)."""
    t = torch.zeros(1, 1, dtype=torch.long)
    f = mu.causal_mask_function
    return {
        mu.causal_mask_function.__code__: ("causal", ()),
        mu.bidirectional_mask_function.__code__: ("all", ()),
        mu.sliding_window_overlay(1).__code__: ("window", ("sliding_window",)),
        mu.sliding_window_bidirectional_overlay(1).__code__: ("window_bi", ("sliding_window",)),
        mu.padding_mask_function(t).__code__: ("padding", ("padding_mask",)),
        mu.packed_sequence_mask_function(t).__code__: ("packed", ("packed_sequence_mask",)),
        mu.remap_positions_for_packed_sequence(f, t).__code__: (
            "remap",
            ("mask_function", "position_ids"),
        ),
        mu.and_masks(f).__code__: ("and", ("mask_functions",)),
        mu.or_masks(f).__code__: ("or", ("mask_functions",)),
        mu.add_offsets_to_mask_function(f, 0, 0).__code__: (
            "offsets",
            ("mask_function", "q_offset", "kv_offset"),
        ),
    }


_KINDS: dict | None = None
_WARNED: set = set()


def _classify(fn: Callable) -> tuple[str, dict]:
    """("kind", captured values) for a known closure, ("unknown", {}) otherwise."""
    global _KINDS
    if _KINDS is None:
        _KINDS = _kinds()
    code = getattr(fn, "__code__", None)
    kind = _KINDS.get(code)
    if kind is None:
        return "unknown", {}
    name, want = kind
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    try:
        values = {n: cells[n].cell_contents for n in want}
    except (KeyError, ValueError):  # a transformers version with other captured names
        return "unknown", {}
    return name, values


# ---------------------------------------------------------------------------------------------
# nodes: ALL (nothing masked), a band on positions, or an attnkit mask (with a reuse key)
# ---------------------------------------------------------------------------------------------
ALL = None


@dataclass(frozen=True)
class PosBand:
    """``lo <= kv_pos - q_pos <= hi`` (ints or +-inf)."""

    lo: float
    hi: float


@dataclass
class Node:
    """An attnkit mask with the key it can be reused under (None: never reused) and a label."""

    mask: Mask
    key: tuple | None
    label: str


@dataclass(frozen=True)
class Ctx:
    """What the mask is evaluated on: batch B, Lq queries at positions q_off + i, Lk keys at
    kv_off + j."""

    batch: int
    q_len: int
    kv_len: int
    q_off: int
    kv_off: int


def _digest(t: Tensor) -> tuple:
    """A reuse key for a small data tensor: shape, dtype and a hash of its bytes."""
    t = t.detach().cpu().contiguous()
    return (tuple(t.shape), str(t.dtype), hashlib.blake2b(t.numpy().tobytes()).hexdigest())


def _band_node(b: PosBand, ctx: Ctx) -> Node | None:
    """A position band as an attnkit band on indices (named Causal / SlidingWindow when one
    fits); ALL when it allows every (i, j) of the shape."""
    s = ctx.q_off - ctx.kv_off
    # a side that never binds on this shape is open (a window wider than the sequence is causal)
    b = PosBand(
        -INF if b.lo + s <= -(ctx.q_len - 1) else b.lo, INF if b.hi + s >= ctx.kv_len - 1 else b.hi
    )
    lo, hi = b.lo + s, b.hi + s  # on j - i
    if lo == -INF and hi == INF:
        return ALL
    label = f"band[{b.lo}, {b.hi}]"
    for align, off in (("top_left", 0), ("bottom_right", ctx.kv_len - ctx.q_len)):
        if s != off:
            continue
        if b.lo == -INF and b.hi == 0:
            return Node(Causal(align), ("causal", align), f"causal ({align})")
        if b.hi == 0 and -INF < b.lo <= 0:
            left = int(-b.lo)
            return Node(SlidingWindow(left, 0, align), ("window", left, align), label)
        return Node(Band(b.lo, b.hi, align), ("band", b.lo, b.hi, align), label)
    return Node(Band(lo, hi, "top_left"), ("band", lo, hi, "top_left"), label)


def _as_node(x: PosBand | Node | None, ctx: Ctx) -> Node | None:
    return _band_node(x, ctx) if isinstance(x, PosBand) else x


def _combine(op: str, parts: list, ctx: Ctx) -> PosBand | Node | None:
    """Fold children with & or |: bands merge into one band under &; ALL is the identity of &
    and absorbs |."""
    if op == "and":
        parts = [p for p in parts if p is not ALL]
        bands = [p for p in parts if isinstance(p, PosBand)]
        rest = [p for p in parts if not isinstance(p, PosBand)]
        if bands:
            lo, hi = max(b.lo for b in bands), min(b.hi for b in bands)
            rest.insert(0, PosBand(lo, hi))
        parts = rest
    elif any(p is ALL for p in parts):
        return ALL
    if not parts:
        return ALL
    if len(parts) == 1:
        return parts[0]
    nodes = [_as_node(p, ctx) for p in parts]
    if op == "and" and any(n is ALL for n in nodes):
        nodes = [n for n in nodes if n is not ALL]
        if len(nodes) <= 1:
            return nodes[0] if nodes else ALL
    if op == "or" and any(n is ALL for n in nodes):
        return ALL
    out = nodes[0]
    for n in nodes[1:]:
        m = out.mask & n.mask if op == "and" else out.mask | n.mask
        key = None if out.key is None or n.key is None else (op, out.key, n.key)
        sym = " & " if op == "and" else " | "
        out = Node(m, key, f"({out.label}{sym}{n.label})")
    return out


def padding_node(padding: Tensor | None, ctx: Ctx) -> Node | None:
    """The 2-D padding mask (B, >= kv_off + Lk), True = real token, on keys kv_off + j (columns
    past its end are padding, as in ``prepare_padding_mask``)."""
    if padding is None:
        return ALL
    p = padding.detach().to("cpu", torch.bool)
    if p.dim() != 2:
        raise ValueError(f"attention_mask: expected a 2-D padding mask, got {tuple(p.shape)}")
    cols = p[:, ctx.kv_off : ctx.kv_off + ctx.kv_len]
    if cols.shape[1] < ctx.kv_len:
        cols = torch.nn.functional.pad(cols, (0, ctx.kv_len - cols.shape[1]), value=False)
    if cols.shape[0] not in (1, ctx.batch):
        raise ValueError(
            f"attention_mask: expected {ctx.batch} rows (the batch), got {tuple(p.shape)}"
        )
    if bool(cols.all()):
        return ALL
    lengths = cols.sum(1)
    right = torch.arange(ctx.kv_len)[None, :] < lengths[:, None]
    if bool((right == cols).all()):
        return Node(KeyPadding(lengths), ("pad", _digest(lengths)), "key padding")
    return Node(from_key_padding_mask(~cols), ("cols", _digest(cols)), "key columns")


def _predicate(fn: Callable, ctx: Ctx, why: str) -> Node:
    """``fn`` evaluated exactly on positions (q_off + i, kv_off + j); warns once per function."""
    code = getattr(fn, "__code__", fn)
    if code not in _WARNED:
        _WARNED.add(code)
        name = getattr(fn, "__qualname__", type(fn).__name__)
        warnings.warn(
            f"attnkit: transformers mask function {name!r} {why}; it is evaluated exactly with "
            "attnkit.masks.Predicate (block map: O(Lq*Lk) work once per shape, cached)",
            UnrecognisedMaskWarning,
            stacklevel=4,
        )
    qo, ko = ctx.q_off, ctx.kv_off

    def at_positions(b, h, q, k):
        out = fn(b, h, q + qo, k + ko)
        if not isinstance(out, Tensor):
            out = torch.as_tensor(out)
        if out.dtype != torch.bool:
            raise TypeError(
                f"mask_function {getattr(fn, '__qualname__', fn)!r}: expected a bool tensor, "
                f"got {out.dtype}"
            )
        return out.cpu()

    at_positions.__name__ = getattr(fn, "__name__", "mask_function")
    m = Predicate(at_positions, batch_size=ctx.batch)
    return Node(m, None, f"predicate({at_positions.__name__})")


def _packed(psm: Tensor, ctx: Ctx) -> Node | None:
    """Packed-sequence ids (B, L) as a Document mask on (q_off + i, kv_off + j); None when they
    are not an integer (B, L) tensor covering the lengths."""
    if not isinstance(psm, Tensor) or psm.dim() != 2 or psm.is_floating_point():
        return None
    ids = psm.detach().cpu()
    q_ids = ids[:, ctx.q_off : ctx.q_off + ctx.q_len]
    k_ids = ids[:, ctx.kv_off : ctx.kv_off + ctx.kv_len]
    if q_ids.shape[1] != ctx.q_len or k_ids.shape[1] != ctx.kv_len:
        return None
    if q_ids.shape[0] == 1 and ctx.batch > 1:
        q_ids, k_ids = q_ids.expand(ctx.batch, -1), k_ids.expand(ctx.batch, -1)
    return Node(
        Document(q_ids, k_ids), ("docs", _digest(q_ids), _digest(k_ids)), "packed documents"
    )


def _positions_consecutive(psm: Tensor, pos: Tensor) -> bool:
    """True when, inside every packed sequence, positions go up by 1 per token (so differences
    of positions equal differences of indices)."""
    if psm.shape != pos.shape or psm.dim() != 2:
        return False
    same = psm[:, 1:] == psm[:, :-1]
    step = (pos[:, 1:] - pos[:, :-1]) == 1
    return bool((step | ~same).all())


def _is_band(x) -> bool:
    return x is ALL or isinstance(x, PosBand)


def build(fn: Callable, ctx: Ctx, packed: Tensor | None = None) -> PosBand | Node | None:
    """The node for mask function ``fn`` on ``ctx``. ``packed``: the packed-sequence ids of a
    sibling ``packed_sequence_mask_function`` (for remapped positions)."""
    kind, v = _classify(fn)
    if kind == "causal":
        return PosBand(-INF, 0)
    if kind == "all":
        return ALL  # q_idx >= 0 holds for every query position
    if kind == "window":
        w = v["sliding_window"]
        if not isinstance(w, int) or isinstance(w, bool):
            return _predicate(fn, ctx, "has a non-int window")
        return PosBand(-(w - 1), INF)
    if kind == "window_bi":
        w = v["sliding_window"]
        if not isinstance(w, int) or isinstance(w, bool):
            return _predicate(fn, ctx, "has a non-int window")
        return PosBand(-w, w)
    if kind == "padding":
        return padding_node(v["padding_mask"], ctx)
    if kind == "packed":
        node = _packed(v["packed_sequence_mask"], ctx)
        return node if node is not None else _predicate(fn, ctx, "does not fit the lengths")
    if kind == "remap":
        return _remap(fn, v, ctx, packed)
    if kind == "offsets":
        q, k = v["q_offset"], v["kv_offset"]
        inner = Ctx(ctx.batch, ctx.q_len, ctx.kv_len, ctx.q_off + int(q), ctx.kv_off + int(k))
        return _as_node(build(v["mask_function"], inner), inner)
    if kind in ("and", "or"):
        fns = v["mask_functions"]
        sib = None
        if kind == "and":  # packed sequences: and_masks(packed ids, remapped positions)
            for f in fns:
                k2, v2 = _classify(f)
                if k2 == "packed":
                    sib = v2["packed_sequence_mask"]
        parts = [build(f, ctx, sib) for f in fns]
        return _combine(kind, parts, ctx)
    return _predicate(fn, ctx, "is not one attnkit recognises")


def _remap(fn: Callable, v: dict, ctx: Ctx, packed: Tensor | None):
    """``mask_function`` on per-sequence positions: inside one packed sequence (the sibling
    Document mask restricts to it) a band on positions is the same band on indices."""
    pos = v["position_ids"]
    if not isinstance(pos, Tensor) or pos.dim() != 2:
        return _predicate(fn, ctx, "has position_ids attnkit cannot read")
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
    return _predicate(fn, ctx, "remaps positions in a way attnkit cannot restate")


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
    node = _combine("and", [build(mask_function, ctx), padding_node(padding, ctx)], ctx)
    node = _as_node(node, ctx)
    if node is ALL:
        return HFMask(None, ctx.batch, ctx.q_len, ctx.kv_len, "no mask (every key allowed)")
    mask = node.mask
    if node.key is not None:
        key = (node.key, ctx)
        hit = _REUSE.get(key)
        mask = hit if hit is not None else _REUSE.put(key, mask)
    return HFMask(mask, ctx.batch, ctx.q_len, ctx.kv_len, node.label)
