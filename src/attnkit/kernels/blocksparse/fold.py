"""Grouped-query attention folded into the plans of the ``blocksparse`` backend.

A grouped call has q (..., H, Lq, d) and k, v (..., Hkv, Lk, d), the G = H / Hkv query heads
of key/value head c being heads c*G .. c*G + G - 1. When the mask does not vary over the head
dim, those G heads attend to the same keys with the same mask, so their rows can share every
SDPA call: q is laid out once as (..., Hkv, Lq * G, d) with row ``i * G + g`` holding query i of
head c*G + g (:func:`fold_q`), and the plan built for positions is turned into a plan on those
rows (:func:`fold_plan`): every query range q0:q1 becomes q0*G:q1*G, every tile mask and row
flag is repeated G times along its rows. One fused call then covers the G heads of a query
block against one key range, k and v are read with their Hkv heads (never repeated), and the
fused backward sums the G heads' contributions to dk and dv itself.

Calls the fold cannot serve go back to the repeated path
(:func:`attnkit.kernels.call.base.ungrouped`): a mask that varies over the head dim (each head needs
its own tile masks).

Shape legend: ``H`` query heads, ``Hkv`` key/value heads, ``G`` = H / Hkv, ``d`` width.
"""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from attnkit.kernels.blocksparse.plans import BandPlan, CallsPlan, Plan
from attnkit.kernels.blocksparse.tiles import Call
from attnkit.kernels.call.base import AttentionCall


def lead_dims(call: AttentionCall) -> int:
    """Number of leading batch dims of q the call's mask varies over (trailing 1s dropped)."""
    shape = list(call.mask.batch_shape) if call.mask is not None else []
    while shape and shape[-1] == 1:
        shape.pop()
    return len(shape)


def group_size(call: AttentionCall) -> int:
    """G = H / Hkv when ``call`` is grouped and its mask is shared by the heads of a group
    (the mask varies over no dim from the head dim on), so the fold applies; else 0 (1 for a
    call that is not grouped)."""
    if not call.grouped:
        return 1
    if lead_dims(call) > call.q.dim() - 3:
        return 0
    return call.q.shape[-3] // call.k.shape[-3]


def fold_q(q: Tensor, g: int) -> Tensor:
    """q (..., Hkv * G, Lq, d) -> (..., Hkv, Lq * G, d), row i * G + g' = query i of head
    c * G + g' (a copy; q itself when G = 1)."""
    if g == 1:
        return q
    lq, d = q.shape[-2:]
    t = q.unflatten(-3, (q.shape[-3] // g, g)).transpose(-3, -2)  # (..., Hkv, Lq, G, d)
    return t.reshape(t.shape[:-3] + (lq * g, d))


def unfold_out(out: Tensor, g: int) -> Tensor:
    """The inverse of :func:`fold_q` for the output: (..., Hkv, Lq * G, d) -> (..., H, Lq, d)."""
    if g == 1:
        return out
    t = out.unflatten(-2, (out.shape[-2] // g, g)).transpose(-3, -2)  # (..., Hkv, G, Lq, d)
    return t.flatten(-4, -3)


def _rep(t: Tensor | None, g: int) -> Tensor | None:
    """A tile mask or row flag (..., n, m) with each row repeated G times: (..., n * G, m)."""
    return None if t is None else t.repeat_interleave(g, dim=-2)


def _fold_call(c: Call, g: int) -> Call | None:
    if c.is_causal or c.band is not None:
        return None  # SDPA's is_causal would compare folded row numbers with key positions
    return replace(c, q0=c.q0 * g, q1=c.q1 * g, mask=_rep(c.mask, g), row_ok=_rep(c.row_ok, g))


def fold_plan(plan: Plan, g: int) -> Plan | None:
    """``plan`` (built for query positions) on folded rows (:func:`fold_q`), or None when a
    call of it cannot be folded (a causal document call)."""
    if g == 1:
        return plan
    calls = tuple(_fold_call(c, g) for c in plan.calls)
    if any(c is None for c in calls):
        return None
    if isinstance(plan, BandPlan):
        return replace(plan, calls=calls, fold=g, mask=_rep(plan.mask, g))
    assert isinstance(plan, CallsPlan)
    return replace(plan, calls=calls, fold=g)
