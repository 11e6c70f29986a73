"""attnkit masks as FlexAttention modifiers: the allowed part as a ``mask_mod``, score biases
(ALiBi, float masks) and softcapping as a ``score_mod``.

Flex sees every call as (B, H, L, d): a call with batch dims ``(...)`` of length 0, 1 or 2 is
viewed as (1, 1), (1, N) or (B, H) (:class:`FlexLayout`). A mask's batch dims line up with the
*leading* batch dims of q (see :mod:`attnkit.masks`), so mask batch dim ``i`` is Flex's index
``FlexLayout.dims[i]`` ("b" or "h"), or index 0 where the mask's dim is 1.

Every modifier here is written with broadcasting torch ops and indexing only, so it serves
both Flex (which calls it on 0-d index tensors under ``vmap`` or inside its compiled kernel)
and a dense evaluation on index grids (the exact refinement of block maps and the tests).
The mask's tensors are copied to the call's device once (:class:`FlexMods` is cached per
mask, lengths, layout and device by the backend). Indices are clamped into range before a
tensor is read, since Flex may evaluate the padding of a last, shorter block.

Shape legend: ``b``, ``h``, ``q_idx``, ``kv_idx`` broadcastable int index tensors; ``Lq``,
``Lk`` the call's lengths; ``nb`` the call's batch dims (0, 1 or 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit import masks as M
from attnkit.masks.base import Intersection, Union
from attnkit.masks.blocks import offset, saturate
from attnkit.masks.tensor import KeyColumns

__all__ = ["FlexLayout", "FlexMods", "MaskMod", "ScoreMod", "build_mods", "supported_mask"]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]

F32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class FlexLayout:
    """How a call with ``nb`` batch dims (0, 1 or 2) is seen by Flex: ``dims`` names the Flex
    index ("b" or "h") of each call batch dim: () / ("h",) / ("b", "h")."""

    nb: int

    @property
    def dims(self) -> tuple[str, ...]:
        return ("b", "h")[2 - self.nb :]


@dataclass(frozen=True)
class FlexMods:
    """A mask (and softcap) translated for Flex, for one (Lq, Lk, layout, device).

    mask_mod: (b, h, q_idx, kv_idx) -> bool, True = may attend; None when every key is
        allowed. bias_mod: (b, h, q_idx, kv_idx) -> float32 bias added to the scores, or None.
    score_mod: the Flex ``score_mod`` (softcap, then bias), or None when there is neither.
    """

    mask_mod: MaskMod | None
    bias_mod: MaskMod | None
    score_mod: ScoreMod | None


class _Pick:
    """Reads a mask tensor whose leading dims are the mask's batch dims at Flex's (b, h)."""

    def __init__(self, batch_shape: tuple[int, ...], layout: FlexLayout) -> None:
        self.plan = tuple(
            (layout.dims[i] if size > 1 else None) for i, size in enumerate(batch_shape)
        )

    def index(self, b: Tensor, h: Tensor) -> tuple:
        return tuple(0 if d is None else (b if d == "b" else h) for d in self.plan)


def supported_mask(mask: M.Mask | None, nb: int) -> str | None:
    """None when :func:`build_mods` translates ``mask`` for a call with ``nb`` batch dims, else
    the reason it does not."""
    if nb > 2:
        return f"{nb} batch dims (Flex takes (B, H, L, d): at most 2)"
    if mask is None:
        return None
    if len(mask.batch_shape) > nb:
        return f"mask batch shape {mask.batch_shape} has more dims than the inputs' {nb}"
    for leaf in mask.leaves():
        if not isinstance(leaf, _LEAF_TYPES):
            return f"no Flex translation for the mask kind {type(leaf).__name__}"
    return None


def _band(m: M.Band, lq: int, lk: int, dev) -> MaskMod:
    off = offset(m.alignment, lq, lk)
    big = lq + lk + 1  # a side wider than this is open
    lo = None if m.lo == -math.inf or m.lo < -big else int(m.lo)
    hi = None if m.hi == math.inf or m.hi > big else int(m.hi)

    def mod(b, h, q_idx, kv_idx):
        d = kv_idx - (q_idx + off)
        out = d == d  # all True, with the broadcast shape and device of the indices
        if lo is not None:
            out = out & (d >= lo)
        if hi is not None:
            out = out & (d <= hi)
        return out

    return mod


def _key_padding(m: M.KeyPadding, layout: FlexLayout, dev) -> MaskMod:
    n, pick = m.lengths.to(dev), _Pick(m.batch_shape, layout)

    def mod(b, h, q_idx, kv_idx):
        return kv_idx < n[pick.index(b, h)]

    return mod


def _document(m: M.Document, lq: int, lk: int, layout: FlexLayout, dev) -> MaskMod:
    ids, kv, pick = m.ids.to(dev), m.kv_ids.to(dev), _Pick(m.batch_shape, layout)

    def mod(b, h, q_idx, kv_idx):
        i = pick.index(b, h)
        qi, ki = q_idx.clamp(0, lq - 1), kv_idx.clamp(0, lk - 1)
        return ids[i + (qi,)] == kv[i + (ki,)]

    return mod


def _prefix(m: M.PrefixLM, lq: int, lk: int, layout: FlexLayout, dev) -> MaskMod:
    p, pick, off = m.prefix.to(dev), _Pick(m.batch_shape, layout), offset(m.alignment, lq, lk)

    def mod(b, h, q_idx, kv_idx):
        pre = p[pick.index(b, h)] if m.batch_shape else p[0]
        return (kv_idx < pre) | (kv_idx <= q_idx + off)

    return mod


def _tensor_allowed(m: M.TensorMask, lq: int, lk: int, layout: FlexLayout, dev) -> MaskMod:
    t, pick = m.t.to(dev), _Pick(m.batch_shape, layout)
    ok = t if t.dtype == torch.bool else t != -math.inf

    def mod(b, h, q_idx, kv_idx):
        return ok[pick.index(b, h) + (q_idx.clamp(0, lq - 1), kv_idx.clamp(0, lk - 1))]

    return mod


def _columns_allowed(m: KeyColumns, lk: int, layout: FlexLayout, dev) -> MaskMod:
    c, pick = m.cols.to(dev), _Pick(m.batch_shape, layout)
    ok = c if c.dtype == torch.bool else c != -math.inf

    def mod(b, h, q_idx, kv_idx):
        return ok[pick.index(b, h) + (kv_idx.clamp(0, lk - 1),)]

    return mod


def _predicate(m: M.Predicate, lq: int, lk: int, layout: FlexLayout) -> MaskMod:
    pick, off = _Pick(m.batch_shape, layout), offset(m.alignment, lq, lk)

    def mod(b, h, q_idx, kv_idx):
        idx = pick.index(b, h) + (0, 0)
        bb, hh = (torch.zeros_like(q_idx) if isinstance(x, int) else x for x in idx[:2])
        return m.fn(bb, hh, q_idx + off, kv_idx)

    return mod


def allowed_mod(mask: M.Mask, lq: int, lk: int, layout: FlexLayout, dev) -> MaskMod | None:
    """The allowed part of ``mask`` as a ``mask_mod``; None when it allows every key (ALiBi)."""
    if isinstance(mask, (Intersection, Union)):
        a = allowed_mod(mask.a, lq, lk, layout, dev)
        c = allowed_mod(mask.b, lq, lk, layout, dev)
        if a is None or c is None:  # one side allows every key
            if isinstance(mask, Union):
                return None
            return c if a is None else a
        if isinstance(mask, Intersection):
            return lambda b, h, q_idx, kv_idx: a(b, h, q_idx, kv_idx) & c(b, h, q_idx, kv_idx)
        return lambda b, h, q_idx, kv_idx: a(b, h, q_idx, kv_idx) | c(b, h, q_idx, kv_idx)
    if isinstance(mask, M.ALiBi):
        return None
    if isinstance(mask, M.Band):
        return _band(mask, lq, lk, dev)
    if isinstance(mask, M.KeyPadding):
        return _key_padding(mask, layout, dev)
    if isinstance(mask, M.Document):
        return _document(mask, lq, lk, layout, dev)
    if isinstance(mask, M.PrefixLM):
        return _prefix(mask, lq, lk, layout, dev)
    if isinstance(mask, M.TensorMask):
        return _tensor_allowed(mask, lq, lk, layout, dev)
    if isinstance(mask, KeyColumns):
        return _columns_allowed(mask, lk, layout, dev)
    if isinstance(mask, M.Predicate):
        return _predicate(mask, lq, lk, layout)
    raise TypeError(f"mask: no Flex translation for {type(mask).__name__}")


def _finite_bias(t: Tensor, dev) -> Tensor:
    """A float mask tensor as the bias it adds (0 where -inf: the mask_mod disallows those),
    float32 on ``dev``, saturated at +-finfo(float32).max (policy P5)."""
    t = t.detach().to(dev)
    t = torch.where(t == -math.inf, torch.zeros((), dtype=t.dtype, device=dev), t)
    return saturate(t, torch.float32)


def bias_mod(mask: M.Mask, lq: int, lk: int, layout: FlexLayout, dev) -> MaskMod | None:
    """The score bias of ``mask`` (float32) as a function of (b, h, q_idx, kv_idx); None
    without a bias. Biases of an :class:`Intersection` add up."""
    if not mask.has_bias:
        return None
    if isinstance(mask, Intersection):
        fa = bias_mod(mask.a, lq, lk, layout, dev)
        fb = bias_mod(mask.b, lq, lk, layout, dev)
        if fa is None or fb is None:
            return fb if fa is None else fa
        return lambda b, h, q_idx, kv_idx: fa(b, h, q_idx, kv_idx) + fb(b, h, q_idx, kv_idx)
    pick = _Pick(mask.batch_shape, layout)
    if isinstance(mask, M.ALiBi):
        s = mask.slopes.to(device=dev, dtype=torch.float32)
        off = offset(mask.alignment, lq, lk)

        def alibi(b, h, q_idx, kv_idx):
            slope = s[pick.index(b, h)[1]] if mask.batch_shape else s
            dist = (kv_idx - (q_idx + off)).abs().to(torch.float32)
            return (-slope * dist).clamp(min=-F32_MAX)

        return alibi
    if isinstance(mask, M.TensorMask):
        t = _finite_bias(mask.t, dev)
        return lambda b, h, q_idx, kv_idx: t[
            pick.index(b, h) + (q_idx.clamp(0, lq - 1), kv_idx.clamp(0, lk - 1))
        ]
    if isinstance(mask, KeyColumns):
        c = _finite_bias(mask.cols, dev)
        return lambda b, h, q_idx, kv_idx: c[pick.index(b, h) + (kv_idx.clamp(0, lk - 1),)]
    raise TypeError(f"mask: no Flex score bias for {type(mask).__name__}")


def score_mod_of(bias: MaskMod | None, softcap: float | None, dev=None) -> ScoreMod | None:
    """Flex's ``score_mod``: the scaled score capped (c * tanh(s / c)), then the bias added.
    The cap is held as a 0-d float32 tensor on ``dev`` (a buffer of the compiled kernel), so
    a new value is new data, not a new specialisation of the kernel."""
    if bias is None and softcap is None:
        return None
    if softcap is None:
        return lambda score, b, h, q_idx, kv_idx: score + bias(b, h, q_idx, kv_idx)
    cap = torch.tensor(softcap, dtype=torch.float32, device=dev)
    if bias is None:
        return lambda score, b, h, q_idx, kv_idx: cap * torch.tanh(score / cap)
    return lambda score, b, h, q_idx, kv_idx: (
        cap * torch.tanh(score / cap) + bias(b, h, q_idx, kv_idx)
    )


def build_mods(
    mask: M.Mask | None,
    q_len: int,
    kv_len: int,
    layout: FlexLayout,
    device: torch.device,
    softcap: float | None = None,
) -> FlexMods:
    """``mask`` (checked by :func:`supported_mask`) and ``softcap`` as Flex modifiers for a
    call of lengths (Lq, Lk) with ``layout``, reading the mask's tensors on ``device``."""
    if mask is None:
        return FlexMods(None, None, score_mod_of(None, softcap, device))
    allowed = allowed_mod(mask, q_len, kv_len, layout, device)
    bias = bias_mod(mask, q_len, kv_len, layout, device)
    return FlexMods(allowed, bias, score_mod_of(bias, softcap, device))


_LEAF_TYPES = (M.Band, M.KeyPadding, M.Document, M.PrefixLM, M.TensorMask, KeyColumns)
_LEAF_TYPES = _LEAF_TYPES + (M.Predicate, M.ALiBi)
