"""The one front door of every attention call: :func:`parse`, from user arguments to a
:class:`Parsed` record (the validated :class:`~attnkit.kernels.call.base.AttentionCall`, the
backend that runs it, and the call's :class:`Signature`).

It is the only place that validates (the checks are :mod:`attnkit.call_checks`) and the only
constructor of ``AttentionCall``. Every public function of :mod:`attnkit.functional` calls it
and hands the record to :func:`attnkit.kernels.dispatch.run`.

A dot-product call whose signature (tensor types, shapes, strides, dtypes, devices, grad flags,
the mask's identity, the options) was seen before skips the checks and the choice: dispatch
remembers the outcome per signature (``dispatch.CACHE``), and the call is built without the
frozen dataclass's per-field ``object.__setattr__`` (the per-call fast path, :func:`_remembered`).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from attnkit import call_checks as cc
from attnkit import checks
from attnkit.heads import split_heads
from attnkit.kernels import dispatch
from attnkit.kernels.call.backend import Backend
from attnkit.kernels.call.base import AttentionCall, ungrouped
from attnkit.kernels.call.memo import CallMemo
from attnkit.kernels.dispatch import CACHE, mask_key, tensor_key
from attnkit.kernels.policy.scan import plan3
from attnkit.kernels.policy.steady import steady_for

__all__ = ["Kind", "Parsed", "Signature", "grouped_for", "parse"]

Kind = Literal["dot", "dot-unscaled", "gqa", "general", "additive", "multi-head"]
"""What :func:`parse` parses: scaled / unscaled dot products, grouped-query attention (k, v
with G < H heads), Luong's general and Bahdanau's additive scores, and multi-head attention
(``q``, ``k``, ``v`` then are query, key and value before their projections)."""

_KINDS = ("dot", "dot-unscaled", "gqa", "general", "additive", "multi-head")


class Signature(NamedTuple):
    """What a remembered choice depends on: dispatch's key for a call (``dispatch.CACHE``).

    q, k, v: (type, shape, stride, dtype, device, requires_grad); mask:
    :func:`~attnkit.kernels.dispatch.mask_key` (None: the mask cannot be remembered); each
    option with its type (1, 1.0 and True hash alike); the requested backend name; the grad
    mode; sinks as :func:`~attnkit.kernels.dispatch.tensor_key` with its type (or None).
    A named tuple: hashed and compared in C at every lookup (a dataclass's generated
    ``__hash__`` and ``__eq__`` would run Python code on the per-call path).
    """

    kind: str
    q: tuple
    k: tuple
    v: tuple
    mask: tuple | None
    scale: tuple
    dropout_p: tuple
    return_weights: tuple
    backend: object
    grad: bool
    softcap: tuple
    sinks: tuple | None


class Parsed(NamedTuple):
    """What :func:`parse` returns: the call, the backend that runs it (None when parsed with
    ``select=False``, for ``explain_dispatch``), and the call's signature (None when the call
    is not remembered: non-dot kinds, masks without a stable identity)."""

    call: AttentionCall
    backend: Backend | None
    signature: Signature | None


def parse(
    kind: Kind,
    q: object,
    k: object,
    v: object,
    mask: object = None,
    *,
    scale: object = None,
    dropout_p: object = 0.0,
    return_weights: object = False,
    backend: object = "auto",
    softcap: object = None,
    sinks: object = None,
    select: bool = True,
    **weights: object,
) -> Parsed:
    """Check every argument of an attention call of ``kind`` (cheap checks first) and build
    the call and its backend; a remembered dot-product signature skips both.

    q (..., Lq, dk), k (..., Lk, dk), v (..., Lk, dv) (for ``"gqa"``: q (..., H, Lq, dk), k and
    v with G heads dividing H); ``mask``, ``scale``, ``dropout_p``, ``return_weights``,
    ``backend``, ``softcap``, ``sinks`` as in
    :func:`attnkit.functional.scaled_dot_product_attention`.
    ``weights``: ``w`` (dq, dk) for ``"general"``; ``w_q``, ``w_k``, ``w_v`` for
    ``"additive"``; for ``"multi-head"`` (q, k, v = query (B, Lq, E), key, value)
    ``num_heads``, ``num_kv_heads``, ``w_q``, ``w_k``, ``w_v``, ``w_o``, ``b_q``, ``b_k``,
    ``b_v``, ``b_o`` and ``average_weights``, with their projections computed only after
    every check. ``select=False``: no backend is chosen (``Parsed.backend`` None) and nothing
    is remembered. Errors name the argument as the caller passed it."""
    signature = None
    if select and (kind == "dot" or kind == "gqa" or kind == "dot-unscaled"):
        hit = _remembered(
            kind, q, k, v, mask, scale, dropout_p, return_weights, backend, softcap, sinks
        )
        if type(hit) is Parsed:
            return hit
        signature = hit  # None or the signature to remember
    if kind == "gqa" and isinstance(q, Tensor) and isinstance(k, Tensor) and q.dim() >= 3:
        if k.dim() == q.dim() and k.shape[-3] == q.shape[-3]:
            kind = "dot"  # G = H: checked and chosen as plain attention
    options = (scale, dropout_p, return_weights, backend)
    if kind == "dot" or kind == "dot-unscaled" or kind == "gqa":
        return _dot(kind, q, k, v, mask, options, softcap, sinks, select, signature)
    if kind == "multi-head":
        return _multi_head(q, k, v, mask, options, softcap, sinks, **weights)
    if softcap is not None or sinks is not None:
        raise ValueError(
            "softcap, sinks: defined for dot-product scores only (kind='dot'), "
            f"not for {kind} attention"
        )
    if kind == "general":
        return _general(q, k, v, mask, return_weights, backend, select, **weights)
    if kind == "additive":
        return _additive(q, k, v, mask, return_weights, backend, select, **weights)
    raise ValueError(f"kind: expected one of {_KINDS}, got {kind!r}")


def grouped_for(b: Backend, call: AttentionCall) -> AttentionCall:
    """``call`` as backend ``b`` takes it: grouped k and v as they are when ``b`` declares
    ``supports_gqa`` (no copies), else repeated to q's H heads."""
    return call if b.supports_gqa else ungrouped(call)


# ---------------------------------------------------------------------------------------------
# the fast path: a remembered signature
# ---------------------------------------------------------------------------------------------
_new = tuple.__new__
"""How the per-call path builds a named tuple (what its own constructor calls)."""


def _remembered(kind, q, k, v, mask, scale, dropout_p, return_weights, backend, softcap, sinks):
    """The :class:`Parsed` record of a remembered signature, its checked options from the
    choice (a mask tensor lifted as checked before, the remembered scan plan in the call's
    memo); else the signature to remember after the checks (None when it cannot be remembered:
    arguments that are not tensors, unhashable options, a mask without a stable identity).

    Written out, as it runs per call: the records are built by ``tuple.__new__`` (what a named
    tuple's own constructor calls) and the call without the frozen dataclass's per-field
    ``object.__setattr__``, with every field of :class:`AttentionCall`."""
    grad = torch.is_grad_enabled()
    try:
        signature = _new(Signature, (
            kind,
            (type(q), q.shape, q.stride(), q.dtype, q.device, q.requires_grad),
            (type(k), k.shape, k.stride(), k.dtype, k.device, k.requires_grad),
            (type(v), v.shape, v.stride(), v.dtype, v.device, v.requires_grad),
            () if mask is None else mask_key(mask, grad),
            (type(scale), scale), (type(dropout_p), dropout_p),
            (type(return_weights), return_weights),
            backend,
            grad,
            (type(softcap), softcap),
            None if sinks is None else (type(sinks), *tensor_key(sinks)),
        ))  # fmt: skip
        if signature.mask is None:
            return None
        hit = CACHE.get(signature, mask)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option: checked below
        return None
    if hit is None:
        return signature
    if mask is not None and isinstance(mask, Tensor):
        mask = cc.lift_mask(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2])
    if sinks is not None:
        sinks = cc.finite_sinks(sinks)  # the values change between calls
    scale, dropout_p, return_weights, softcap = hit.options
    memo = CallMemo()
    if hit.scan_plan is not None:
        memo.scan_plan = hit.scan_plan
        memo.steady = hit.steady
    call = object.__new__(AttentionCall)
    call.__dict__.update(
        kind="dot", q=q, k=k, v=v, mask=mask, scale=scale, dropout_p=dropout_p,
        return_weights=return_weights, w_q=None, w_k=None, w_v=None, softcap=softcap,
        sinks=sinks, memo=memo,
    )  # fmt: skip
    b = hit.backend
    if kind == "gqa" and not b.supports_gqa:
        call = ungrouped(call)
    return _new(Parsed, (call, b, signature))


def _remember(signature: Signature, b: Backend, options: tuple, mask, call, qkv: tuple) -> None:
    """Remember ``b`` and the normalised ``options`` under ``signature``, with the scan plan
    of the caller's q, k and v (``qkv``, as later calls of the signature pass them) and the
    policy's check of its common case for ``call`` on ``b``."""
    plan = plan3(*qkv)
    CACHE.put(signature, b, options, mask, plan, steady_for(call, b, plan))


def _chosen(call, backend, select: bool, signature: Signature | None, mask) -> Parsed:
    """``call`` with its backend (dispatch's choice for ``backend``), remembered under
    ``signature``; no choice when not ``select``."""
    if not select:
        dispatch.check_backend_name(backend)
        return Parsed(call, None, None)
    b = dispatch.select(call, dispatch.check_backend_name(backend))
    if signature is not None:
        options = (call.scale, call.dropout_p, call.return_weights, call.softcap)
        _remember(signature, b, options, mask, call, (call.q, call.k, call.v))
    return Parsed(call, b, signature)


# ---------------------------------------------------------------------------------------------
# the checks of each kind (cheap ones first), then the call
# ---------------------------------------------------------------------------------------------
def _dot(kind, q, k, v, mask, options, softcap, sinks, select, signature) -> Parsed:
    """Dot-product calls: scaled, unscaled (scale 1), grouped-query (k, v with G < H heads; the
    choice is the one of the call with k and v repeated to H heads, made on stand-in tensors
    before anything is computed). Remembered under ``signature`` when it is not None."""
    scale, dropout_p, return_weights, backend = options
    backend = dispatch.check_backend_name(backend)
    rw = checks.flag("return_weights", return_weights)
    p = checks.probability("dropout_p", dropout_p)
    grouped = kind == "gqa"
    q, k, v = cc.check_grouped(q, k, v) if grouped else cc.check_qkv(q, k, v, same_width=True)
    cap, sinks = cc.check_softcap_sinks(softcap, sinks, q)
    s = 1.0 if kind == "dot-unscaled" else cc.scale_or_default(scale, q.shape[-1])
    batch, lq, lk = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2]
    m = cc.check_mask(mask, batch, lq, lk, q.device)
    if rw:
        dispatch.check_weights_limit(math.prod(batch), lq, lk)
    call = AttentionCall(
        kind="dot", q=q, k=k, v=v, mask=m, scale=s, dropout_p=p, return_weights=rw,
        softcap=cap, sinks=sinks,
    )  # fmt: skip
    if not select:
        return Parsed(call, None, None)
    if grouped:
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        dims = (q.shape[-1], v.shape[-1])
        b = _select_repeated(batch, lq, lk, *dims, q, grad, m, (s, p, rw, cap, sinks), backend)
        call = grouped_for(b, call)
    else:
        b = dispatch.select(call, backend)
    if signature is not None:
        _remember(signature, b, (s, p, rw, cap), mask, call, (q, k, v))
    return Parsed(call, b, signature)


def _select_repeated(batch, lq, lk, dk, dv, ref: Tensor, grad: bool, mask, options, backend):
    """The backend for an H-head call (batch = (..., H)) with H key/value heads, ``mask`` and
    ``options`` = (scale, dropout_p, return_weights, softcap, sinks), chosen on stand-in tensors
    (``ref``'s dtype and device, no memory): the choice is the one of the call with k and v
    repeated, and nothing is computed before every check has passed."""
    scale, dropout_p, rw, softcap, sinks = options
    if rw:
        dispatch.check_weights_limit(math.prod(batch), lq, lk)
    qp, kp, vp = (cc.probe(batch + (n, d), ref, grad) for n, d in ((lq, dk), (lk, dk), (lk, dv)))
    stand_in = AttentionCall(
        kind="dot", q=qp, k=kp, v=vp, mask=mask, scale=scale, dropout_p=dropout_p,
        return_weights=rw, softcap=softcap, sinks=sinks,
    )  # fmt: skip
    return dispatch.select(stand_in, backend)


def _general(q, k, v, mask, return_weights, backend, select, *, w) -> Parsed:
    """Luong's general attention: the unscaled dot product of q W and k, after every check."""
    dispatch.check_backend_name(backend)
    checks.flag("return_weights", return_weights)
    q, k, v = cc.check_qkv(q, k, v, same_width=False)
    w = cc.check_general_weight(w, q, k)
    cc.check_mask(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.device)
    return parse(
        "dot-unscaled",
        q @ w,
        k,
        v,
        mask,
        return_weights=return_weights,
        backend=backend,
        select=select,
    )


def _additive(q, k, v, mask, return_weights, backend, select, *, w_q, w_k, w_v) -> Parsed:
    dispatch.check_backend_name(backend)
    rw = checks.flag("return_weights", return_weights)
    q, k, v = cc.check_qkv(q, k, v, same_width=False)
    w_q, w_k, w_v = cc.check_additive_weights(w_q, w_k, w_v, q, k)
    m = cc.check_mask(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.device)
    call = AttentionCall(
        kind="additive", q=q, k=k, v=v, mask=m, return_weights=rw, w_q=w_q, w_k=w_k, w_v=w_v
    )
    if rw:
        dispatch.check_weights_limit(math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2])
    return _chosen(call, backend, select, None, mask)


def _multi_head(
    query, key, value, mask, options, softcap, sinks, *, num_heads, w_q, w_k, w_v, w_o,
    b_q=None, b_k=None, b_v=None, b_o=None, num_kv_heads=None, average_weights=False,
) -> Parsed:  # fmt: skip
    """Multi-head attention: every argument checked and the backend chosen on stand-in tensors
    before the projections are computed; the call holds the projected heads (B, H, Lq, dk) and
    (B, G, Lk, d)."""
    scale, dropout_p, return_weights, backend = options
    pr = cc.check_projections(
        query, key, value, num_heads, num_kv_heads, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o
    )
    bsz, lq, lk, h, g = pr.query.shape[0], pr.query.shape[1], pr.key.shape[1], pr.heads, pr.kv_heads
    m = cc.check_mask(mask, (bsz, h), lq, lk, pr.query.device)
    s, p = cc.scale_or_default(scale, pr.dk), checks.probability("dropout_p", dropout_p)
    rw = checks.flag("return_weights", return_weights)
    checks.flag("average_weights", average_weights)
    dispatch.check_backend_name(backend)
    cap, sinks = cc.check_softcap_sinks(
        softcap, sinks, cc.probe((bsz, h, lq, pr.dk), pr.query, False)
    )
    ts = (pr.query, pr.key, pr.value, pr.w_q, pr.w_k, pr.w_v, w_o, pr.b_q, pr.b_k, pr.b_v, b_o)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)
    options = (s, p, rw, cap, sinks)
    b = _select_repeated((bsz, h), lq, lk, pr.dk, pr.dv, pr.query, grad, m, options, backend)
    f = torch.nn.functional.linear
    q = split_heads(f(pr.query, pr.w_q, pr.b_q), h)  # (B, H, Lq, dk)
    k = split_heads(f(pr.key, pr.w_k, pr.b_k), g)  # (B, G, Lk, dk)
    v = split_heads(f(pr.value, pr.w_v, pr.b_v), g)  # (B, G, Lk, dv)
    call = AttentionCall(
        kind="dot", q=q, k=k, v=v, mask=m, scale=s, dropout_p=p, return_weights=rw,
        softcap=cap, sinks=sinks,
    )  # fmt: skip
    return Parsed(grouped_for(b, call), b, None)
