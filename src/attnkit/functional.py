"""Public attention functions: validate every argument, then run the backend that dispatch
(:mod:`attnkit.kernels.dispatch`) chooses.

Shape legend
------------
``...``  batch dims (batch, heads, ...), identical for q, k and v (never broadcast silently)
``Lq``   query length          ``Lk``  key/value length
``dk``   query/key width       ``dv``  value width       ``h``  additive hidden width
``B``    batch                 ``H``   query heads       ``G``  key/value heads (divides H)

Masks: a mask object from :mod:`attnkit.masks` (True = may attend; batch data lines up with the
leading batch dim), or a tensor broadcastable to (..., Lq, Lk) with torch's right-aligned rules:
bool (True = may attend) or float (added to the scores; ``-inf`` disallows).

Fully masked rows: a query row with no allowed key gets output 0 and weights 0 (never NaN), in
every backend and in :mod:`attnkit.reference`.

Backends: ``backend="auto"`` picks the first backend in preference order that can serve the
call; :func:`explain_dispatch` says which and why each other one was rejected; ``backend=NAME``
forces one and raises ``ValueError`` with its reasons when it cannot serve the call.

Every argument is checked before any work, and errors name the argument as the caller passed
it. A call whose signature (shapes, strides, dtypes, devices, grad flags, mask identity,
options) was seen before reuses the earlier validation and choice (see
:mod:`attnkit.kernels.dispatch`): repeated calls (the layers of a decoder at one generation
step, a training loop's batches) pay the checks and the choice once per signature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit import calls as C
from attnkit import checks
from attnkit import tensor_checks as tc
from attnkit.calls import check_mask
from attnkit.heads import merge_heads, repeat_kv_heads, split_heads
from attnkit.kernels import dispatch
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.dispatch import Dispatch
from attnkit.kernels.policy import additive as additive_policy
from attnkit.kernels.policy import numerics
from attnkit.masks import Mask

__all__ = [
    "Dispatch",
    "additive_attention",
    "check_mask",
    "dot_product_attention",
    "explain_dispatch",
    "general_attention",
    "grouped_query_attention",
    "merge_heads",
    "multi_head_attention",
    "repeat_kv_heads",
    "scaled_dot_product_attention",
    "split_heads",
]


# ---------------------------------------------------------------------------------------------
# public functions
# ---------------------------------------------------------------------------------------------
def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: str = "auto",
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale + mask) v, with scale = 1/sqrt(d_k) unless given.

    Args:
        q: (..., Lq, dk); k: (..., Lk, dk); v: (..., Lk, dv), same dtype, device, batch dims.
        mask: mask object or tensor (see module docstring); True = may attend.
        scale: finite float (negative and 0 accepted, as by torch's SDPA); default 1/sqrt(dk).
        dropout_p: dropout on the weights, in [0, 1).
        return_weights: also return the weights (..., Lq, Lk) (before dropout).
        backend: "auto" or a backend name (``attnkit.kernels.BACKENDS``).
        softcap: c > 0 caps the scaled scores to c * tanh(s / c) before mask and bias
            (Gemma 2's attention-logit softcapping); None: no cap.
        sinks: (H,) with q (..., H, Lq, dk): one logit per query head that joins every row's
            softmax denominator and is then dropped (gpt-oss's attention sinks; differentiable,
            the returned weights leave the sink out and sum to less than 1).

    Returns:
        output (..., Lq, dv), or (output, weights) when ``return_weights``.

    Equivalent to::

        scores = q @ k.transpose(-2, -1) * scale          # (..., Lq, Lk)
        scores = softcap * tanh(scores / softcap)         # when softcap is given
        scores = scores + bias; scores[~allowed] = -inf
        scores = cat([scores, sinks[h] per row], -1)      # when sinks are given: (..., Lk + 1)
        w = softmax(scores, -1)[..., :Lk]; w[row has no allowed key] = 0
        out = dropout(w) @ v
    """
    call, b = C.dot_call(
        q, k, v, mask, scale, dropout_p, return_weights, backend, True, softcap, sinks
    )
    out, weights = dispatch.run(call, b)
    return (out, weights) if return_weights else out


def dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """Unscaled dot-product attention softmax(q kᵀ + mask) v (seed 004); shapes as in
    :func:`scaled_dot_product_attention`."""
    call, b = C.dot_call(q, k, v, mask, None, dropout_p, return_weights, backend, False)
    out, weights = dispatch.run(call, b)
    return (out, weights) if return_weights else out


def general_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    return_weights: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """Luong's "general" (bilinear) attention: e_ij = q_i W k_jᵀ, then softmax and weighted sum.

    Args:
        q: (..., Lq, dq); k: (..., Lk, dk); v: (..., Lk, dv); w: (dq, dk).
    Returns:
        output (..., Lq, dv) [, weights (..., Lq, Lk)].
    """
    backend = dispatch.check_backend_name(backend)
    checks.flag("return_weights", return_weights)
    q, k, v = C.check_qkv(q, k, v, same_width=False)
    w = tc.floating_tensor("w", w)
    tc.like("w", w, q, "q")
    if w.shape != (q.shape[-1], k.shape[-1]):
        raise ValueError(
            f"w: expected shape (d_q, d_k) = ({q.shape[-1]}, {k.shape[-1]}), got {tuple(w.shape)}"
        )
    C.check_mask(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.device)
    return dot_product_attention(q @ w, k, v, mask, return_weights=return_weights, backend=backend)


def additive_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    return_weights: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """Additive (Bahdanau) attention: e_ij = w_vᵀ tanh(W_q q_i + W_k k_j) (seed 004).

    Args:
        q: (..., Lq, dq); k: (..., Lk, dk); v: (..., Lk, dv).
        w_q: (h, dq); w_k: (h, dk); w_v: (h,).
        mask: as in :func:`scaled_dot_product_attention`.
    Returns:
        output (..., Lq, dv) [, weights (..., Lq, Lk)].
    """
    call, backend = C.additive_call(q, k, v, w_q, w_k, w_v, mask, return_weights, backend)
    out, weights = dispatch.run(call, dispatch.select(call, backend))
    return (out, weights) if return_weights else out


def explain_dispatch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    kind: str = "dot",
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: str = "auto",
    w_q: Tensor | None = None,
    w_k: Tensor | None = None,
    w_v: Tensor | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Dispatch:
    """Which backend would run this call, why each other backend was rejected, and why it runs
    in float64 when the overflow policy sends it there (``precision``).

    ``kind`` is "dot" (scaled / unscaled dot product) or "additive" (then give w_q, w_k, w_v).
    Nothing is computed but the policy's input scan (max |entry| of the inputs); ``softcap`` and
    ``sinks`` as in :func:`scaled_dot_product_attention` (every backend says whether it serves
    them). ``print(explain_dispatch(...))`` gives a readable report.
    """
    checks.choice("kind", kind, ("dot", "additive"))
    backend = dispatch.check_backend_name(backend)
    if kind == "dot":
        q, k, v = C.check_qkv(q, k, v, same_width=True)
        m = C.check_mask(mask, tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.device)
        s, p = C.scale_or_default(scale, q.shape[-1]), checks.probability("dropout_p", dropout_p)
        rw = checks.flag("return_weights", return_weights)
        cap, sk = C.check_softcap_sinks(softcap, sinks, q)
        call = AttentionCall(
            kind="dot", q=q, k=k, v=v, mask=m, scale=s, dropout_p=p, return_weights=rw,
            softcap=cap, sinks=sk,
        )  # fmt: skip
    else:
        if softcap is not None or sinks is not None:
            raise ValueError(
                "softcap, sinks: defined for dot-product scores only (kind='dot'), "
                "not for additive attention"
            )
        call, backend = C.additive_call(q, k, v, w_q, w_k, w_v, mask, return_weights, backend)
    d = dispatch.explain(call, backend)
    reason, falls = None, ()
    if d.chosen is not None:
        policy = numerics if kind == "dot" else additive_policy
        decision = policy.prepare(call, warn=False)[1]
        reason, falls = decision.float64_reason, dispatch.fallbacks(call, d.chosen, decision)
    return Explanation(
        d.chosen,
        d.reasons,
        d.requested,
        d.notes,
        falls,
        precision=None if reason is None else str(reason),
    )


@dataclass(frozen=True)
class Explanation(dispatch.Dispatch):
    """What :func:`explain_dispatch` returns: the :class:`~attnkit.kernels.dispatch.Dispatch`
    (choice and reasons) and ``precision``, "runs in float64 because ..." when the overflow
    policy computes the call in float64 (None otherwise)."""

    precision: str | None = None

    def __str__(self) -> str:
        base = super().__str__()
        return base if self.precision is None else f"{base}\n{self.precision}"


# ---------------------------------------------------------------------------------------------
# multi-head plumbing
# ---------------------------------------------------------------------------------------------
def grouped_query_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: str = "auto",
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Scaled dot-product attention of H query heads over G key/value heads (G divides H;
    grouped-query attention, G = 1 is multi-query): query head h uses key/value head
    h // (H / G).

    Args:
        q: (..., H, Lq, dk); k: (..., G, Lk, dk); v: (..., G, Lk, dv).
        mask, scale, dropout_p, return_weights, backend, softcap, sinks (H,): as in
            :func:`scaled_dot_product_attention`; the mask is against (..., H, Lq, Lk).
    Returns:
        output (..., H, Lq, dv), or (output, weights (..., H, Lq, Lk)).

    k and v are not copied per query head when the chosen backend declares ``supports_gqa``
    (it receives them with G heads, e.g. for SDPA's ``enable_gqa``); otherwise they are
    repeated with :func:`repeat_kv_heads`.
    """
    if isinstance(q, Tensor) and isinstance(k, Tensor) and q.dim() >= 3 and k.dim() == q.dim():
        if k.shape[-3] == q.shape[-3]:  # G = H: plain attention (checks remembered there)
            return scaled_dot_product_attention(
                q, k, v, mask, scale=scale, dropout_p=dropout_p,
                return_weights=return_weights, backend=backend, softcap=softcap, sinks=sinks,
            )  # fmt: skip
    call, b = C.grouped_call(
        q, k, v, mask, scale, dropout_p, return_weights, backend, softcap, sinks
    )
    out, weights = dispatch.run(call, b)
    return (out, weights) if return_weights else out


def multi_head_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    num_heads: int,
    w_q: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    w_o: Tensor,
    b_q: Tensor | None = None,
    b_k: Tensor | None = None,
    b_v: Tensor | None = None,
    b_o: Tensor | None = None,
    mask: Mask | Tensor | None = None,
    *,
    num_kv_heads: int | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    average_weights: bool = False,
    backend: str = "auto",
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """MultiHead(Q, K, V) = Concat(head_1..head_H) W^O, head_i = Attention(Q W^Q_i, K W^K_i,
    V W^V_i) (seed 001); self-attention is ``multi_head_attention(x, x, x, ...)``.

    Weights use ``torch.nn.Linear`` layout (out_features, in_features).

    Args:
        query: (B, Lq, E); key: (B, Lk, E_k); value: (B, Lk, E_v).
        num_heads: H; ``num_kv_heads`` G divides H (grouped-query; 1 = multi-query).
        w_q: (H*dk, E); w_k: (G*dk, E_k); w_v: (G*dv, E_v); w_o: (E_out, H*dv); biases (out,).
        mask: mask object / tensor broadcastable to (B, H, Lq, Lk).
        return_weights: per-head weights (B, H, Lq, Lk); ``average_weights`` averages heads
            to (B, Lq, Lk).
        softcap, sinks (H,): as in :func:`scaled_dot_product_attention`.
    Returns:
        (output (B, Lq, E_out), weights or None).

    Every argument (weights, biases, mask, options, and whether the backend can serve the
    call) is checked before any projection is computed.
    """
    query, key, value = (
        tc.floating_tensor(n, t) for n, t in (("query", query), ("key", key), ("value", value))
    )
    for n, t, what in (("query", query, "Lq"), ("key", key, "Lk"), ("value", value, "Lk")):
        tc.like(n, t, query, "query")
        if t.dim() != 3 or 0 in t.shape:
            raise ValueError(f"{n}: expected a non-empty (B, {what}, E), got {tuple(t.shape)}")
    bsz, lq, lk = query.shape[0], query.shape[1], key.shape[1]
    for n, t in (("key", key), ("value", value)):
        if t.shape[0] != bsz or t.shape[1] != lk:
            raise ValueError(
                f"{n}: expected (B, Lk, .) with B = {bsz} like query and Lk = {lk} like key, "
                f"got {tuple(t.shape)}"
            )
    h = checks.positive_int("num_heads", num_heads)
    g = h if num_kv_heads is None else checks.positive_int("num_kv_heads", num_kv_heads)
    if h % g:
        raise ValueError(f"num_kv_heads: expected a divisor of num_heads={h}, got {g}")
    w_q = C.weight("w_q", w_q, None, query.shape[2], "(num_heads*d_k, E)", query)
    if w_q.shape[0] % h:
        raise ValueError(
            f"w_q: expected num_heads*d_k rows, a multiple of num_heads={h}, "
            f"got shape {tuple(w_q.shape)}"
        )
    dk = w_q.shape[0] // h
    what = f"(num_kv_heads*d_k, E_k) with num_kv_heads={g}, d_k={dk} (from w_q)"
    w_k = C.weight("w_k", w_k, g * dk, key.shape[2], what, query)
    w_v = C.weight("w_v", w_v, None, value.shape[2], "(num_kv_heads*d_v, E_v)", query)
    if w_v.shape[0] % g:
        raise ValueError(
            f"w_v: expected num_kv_heads*d_v rows, a multiple of num_kv_heads={g}, "
            f"got shape {tuple(w_v.shape)}"
        )
    dv = w_v.shape[0] // g
    w_o = C.weight("w_o", w_o, None, h * dv, "(E_out, num_heads*d_v)", query)
    b_q, b_k = C.bias("b_q", b_q, h * dk, query), C.bias("b_k", b_k, g * dk, query)
    b_v, b_o = C.bias("b_v", b_v, g * dv, query), C.bias("b_o", b_o, w_o.shape[0], query)
    m = C.check_mask(mask, (bsz, h), lq, lk, query.device)
    s, p = C.scale_or_default(scale, dk), checks.probability("dropout_p", dropout_p)
    rw = checks.flag("return_weights", return_weights)
    avg = checks.flag("average_weights", average_weights)
    backend = dispatch.check_backend_name(backend)
    ts = (query, key, value, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)
    cap, sinks = C.check_softcap_sinks(softcap, sinks, C.probe((bsz, h, lq, dk), query, False))
    b = C.select_grouped((bsz, h), lq, lk, dk, dv, query, grad, m, s, p, rw, backend, cap, sinks)

    f = torch.nn.functional.linear
    q = split_heads(f(query, w_q, b_q), h)  # (B, H, Lq, dk)
    k = split_heads(f(key, w_k, b_k), g)  # (B, G, Lk, dk)
    v = split_heads(f(value, w_v, b_v), g)  # (B, G, Lk, dv)
    call = AttentionCall(
        kind="dot", q=q, k=k, v=v, mask=m, scale=s, dropout_p=p, return_weights=rw,
        softcap=cap, sinks=sinks,
    )  # fmt: skip
    out, weights = dispatch.run(C.grouped_for(b, call), b)
    out = f(merge_heads(out), w_o, b_o)
    if weights is not None and avg:
        weights = weights.mean(dim=1)
    return out, weights
