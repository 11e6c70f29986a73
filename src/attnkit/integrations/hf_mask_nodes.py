"""The pieces :mod:`attnkit.integrations.hf_masks` rebuilds a transformers mask from: ``ALL``
(nothing masked), a band on positions (:class:`PosBand`), or an attnkit mask with the key it can
be reused under (:class:`Node`), each evaluated on a :class:`Ctx` (batch, lengths, offsets).

Positions: query ``i`` is at ``q_off + i``, key ``j`` at ``kv_off + j``. A band on positions
``lo <= kv_pos - q_pos <= hi`` is the band ``lo + s <= j - i <= hi + s`` on indices with
``s = q_off - kv_off`` (:func:`band_node`).
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.masks import (
    Band,
    Causal,
    Document,
    KeyPadding,
    Mask,
    Predicate,
    SlidingWindow,
    from_key_padding_mask,
)

__all__ = [
    "ALL",
    "Ctx",
    "Node",
    "PosBand",
    "UnrecognisedMaskWarning",
    "as_node",
    "band_node",
    "combine",
    "packed_node",
    "padding_node",
    "predicate",
]

INF = math.inf


class UnrecognisedMaskWarning(UserWarning):
    """A transformers mask function attnkit does not know: it is evaluated exactly through
    :class:`~attnkit.masks.Predicate` (block map cost O(Lq * Lk) per shape, cached)."""


_WARNED: set = set()
"""Code objects already warned about (the warning is once per mask function)."""

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


def digest(t: Tensor) -> tuple:
    """A reuse key for a small data tensor: shape, dtype and a hash of its bytes."""
    t = t.detach().cpu().contiguous()
    return (tuple(t.shape), str(t.dtype), hashlib.blake2b(t.numpy().tobytes()).hexdigest())


def band_node(b: PosBand, ctx: Ctx) -> Node | None:
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


def as_node(x: PosBand | Node | None, ctx: Ctx) -> Node | None:
    return band_node(x, ctx) if isinstance(x, PosBand) else x


def combine(op: str, parts: list, ctx: Ctx) -> PosBand | Node | None:
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
    nodes = [as_node(p, ctx) for p in parts]
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
    right = torch.arange(ctx.kv_len, device="cpu")[None, :] < lengths[:, None]
    if bool((right == cols).all()):
        return Node(KeyPadding(lengths), ("pad", digest(lengths)), "key padding")
    return Node(from_key_padding_mask(~cols), ("cols", digest(cols)), "key columns")


def predicate(fn: Callable, ctx: Ctx, why: str) -> Node:
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
            out = torch.as_tensor(out, device="cpu")
        if out.dtype != torch.bool:
            raise TypeError(
                f"mask_function {getattr(fn, '__qualname__', fn)!r}: expected a bool tensor, "
                f"got {out.dtype}"
            )
        return out.cpu()

    at_positions.__name__ = getattr(fn, "__name__", "mask_function")
    m = Predicate(at_positions, batch_size=ctx.batch)
    return Node(m, None, f"predicate({at_positions.__name__})")


def packed_node(psm: Tensor, ctx: Ctx) -> Node | None:
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
    return Node(Document(q_ids, k_ids), ("docs", digest(q_ids), digest(k_ids)), "packed documents")
