"""The Flex engine: one attention call on torch's FlexAttention, from a mask's :class:`FlexPlan`
(its modifiers and its BlockMask), independent of dispatch.

- :func:`plan_for` builds a plan (:func:`~.mods.build_mods`, :func:`~.block_classes.block_classes`,
  :func:`~.block_mask.from_classes`) and keeps it in the mask's bounded plan cache
  (:attr:`attnkit.masks.Mask.plan_cache`, emptied when a tensor the mask holds changes in
  place) under a :class:`FlexPlanKey`: lengths, layout, device, block size and softcap.
- :func:`attend` runs Flex eagerly or compiled (``torch.compile(flex_attention)``, one
  compiled function per process: dynamo recompiles per shape family and then marks the
  changing sizes dynamic), asks for the log-sum-exp, and folds the sinks in exactly from it:
  with l the row's log-sum-exp and s the head's sink, o' = o * exp(l - logaddexp(l, s)),
  differentiable through Flex's own backward (it takes the log-sum-exp's gradient).
- A row with no allowed key: Flex gives output 0 and log-sum-exp -inf; the sink formula keeps
  the 0 (and its gradient), never NaN.

Shape legend: q (..., H, Lq, dk), k (..., G, Lk, dk), v (..., G, Lk, dv) with at most two
batch dims in all (seen by Flex as (B, H, L, d), :class:`~.mods.FlexLayout`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention

from attnkit.kernels.flex.block_classes import block_classes
from attnkit.kernels.flex.block_mask import flex_classes, from_classes
from attnkit.kernels.flex.mods import FlexLayout, FlexMods, build_mods
from attnkit.masks import Mask
from attnkit.masks.blocks import LRUCache

__all__ = ["FlexPlan", "FlexPlanKey", "attend", "compiled_flex", "first_call", "plan_for"]


@dataclass(frozen=True)
class FlexPlanKey:
    """What a :class:`FlexPlan` depends on besides the mask (its data version is checked by
    the mask's plan cache)."""

    q_len: int
    kv_len: int
    nb: int
    device: torch.device
    block_size: int
    softcap: float | None


@dataclass(frozen=True)
class FlexPlan:
    """A mask ready for Flex: its modifiers, and its BlockMask (None without a mask)."""

    mods: FlexMods
    block_mask: BlockMask | None


@dataclass(frozen=True)
class FamilyKey:
    """A compiled kernel's family: what makes dynamo compile a new one (besides sizes)."""

    device: str
    dtype: torch.dtype
    dims: tuple[int, int]
    grouped: bool
    masked: bool
    biased: bool
    softcap: bool
    sinks: bool
    grad: bool


_NO_MASK_PLANS = LRUCache("flex plans without a mask", 64)
_SEEN: set[FamilyKey] = set()
_LOCK = threading.Lock()
_COMPILED: list = []


def plan_for(mask: Mask | None, key: FlexPlanKey) -> FlexPlan:
    """The Flex plan of ``mask`` (checked by :func:`~.mods.supported_mask`) for ``key``, from
    the mask's plan cache or built now on ``key.device``."""
    cache = _NO_MASK_PLANS if mask is None else mask.plan_cache
    plan = cache.get(key)
    if plan is None:
        plan = cache.put(key, _build(mask, key))
    return plan


def _build(mask: Mask | None, key: FlexPlanKey) -> FlexPlan:
    layout = FlexLayout(key.nb)
    mods = build_mods(mask, key.q_len, key.kv_len, layout, key.device, key.softcap)
    if mask is None:
        return FlexPlan(mods, None)
    bs = key.block_size
    classes = block_classes(mask, key.q_len, key.kv_len, bs, bs, layout, key.device)
    nq, nk = -(-key.q_len // bs), -(-key.kv_len // bs)
    fc = flex_classes(classes, mask.batch_shape, layout, nq, nk)
    return FlexPlan(mods, from_classes(fc, key.q_len, key.kv_len, mods.mask_mod, bs))


def compiled_flex():
    """``torch.compile(flex_attention)``, made once per process."""
    with _LOCK:
        if not _COMPILED:
            _COMPILED.append(torch.compile(flex_attention))
        return _COMPILED[0]


def first_call(family: FamilyKey) -> bool:
    """True until a call of ``family`` ran compiled in this process (its first call compiles
    a kernel: seconds, not microseconds)."""
    return family not in _SEEN


def _four_d(t: Tensor) -> Tensor:
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t
    return t if t.stride(-1) == 1 else t.contiguous()


def attend(
    q: Tensor, k: Tensor, v: Tensor, plan: FlexPlan, scale: float, sinks: Tensor | None,
    compiled: bool, family: FamilyKey | None = None,
) -> Tensor:  # fmt: skip
    """Attention output (..., H, Lq, dv) in q's dtype, on Flex with ``plan``; ``sinks`` (H,)
    logits joining every row's denominator, or None; ``compiled``: the compiled kernel (else
    Flex's eager implementation, which materialises the scores)."""
    shape = q.shape[:-1] + (v.shape[-1],)
    q4, k4, v4 = _four_d(q), _four_d(k), _four_d(v)
    fn = compiled_flex() if compiled else flex_attention
    grouped = k4.shape[1] != q4.shape[1]
    out, aux = fn(
        q4, k4, v4, score_mod=plan.mods.score_mod, block_mask=plan.block_mask, scale=scale,
        enable_gqa=grouped, return_aux=AuxRequest(lse=sinks is not None),
    )  # fmt: skip
    if compiled and family is not None:
        _SEEN.add(family)
    if sinks is not None:
        lse = aux.lse  # (B, H, Lq), natural log; -inf in rows with no allowed key
        finite = torch.isfinite(lse)
        lse = torch.where(finite, lse, torch.zeros((), dtype=lse.dtype, device=lse.device))
        s = sinks.to(lse.dtype)[:, None]
        keep = torch.where(finite, torch.exp(lse - torch.logaddexp(lse, s)), 0.0)
        out = out * keep.unsqueeze(-1).to(out.dtype)
    return out.reshape(shape)
