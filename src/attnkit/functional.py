"""Public attention functions: their signatures and docstrings. Each hands its arguments to
:func:`attnkit.calls.parse` (every check, the call, the backend that dispatch chooses) and runs
the call (:func:`attnkit.kernels.dispatch.run`).

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

from torch import Tensor
from torch.nn.functional import linear

from attnkit.call_checks import check_mask
from attnkit.calls import parse
from attnkit.dispatch_explanation import explain
from attnkit.heads import merge_heads, repeat_kv_heads, split_heads
from attnkit.kernels.dispatch import Dispatch, run
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
    call, b, _ = parse(
        "dot", q, k, v, mask, scale=scale, dropout_p=dropout_p, return_weights=return_weights,
        backend=backend, softcap=softcap, sinks=sinks,
    )  # fmt: skip
    out, weights = run(call, b)
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
    call, b, _ = parse(
        "dot-unscaled", q, k, v, mask, dropout_p=dropout_p, return_weights=return_weights,
        backend=backend,
    )  # fmt: skip
    out, weights = run(call, b)
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
    call, b, _ = parse(
        "general", q, k, v, mask, w=w, return_weights=return_weights, backend=backend
    )
    out, weights = run(call, b)
    return (out, weights) if return_weights else out


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
    call, b, _ = parse(
        "additive", q, k, v, mask, w_q=w_q, w_k=w_k, w_v=w_v, return_weights=return_weights,
        backend=backend,
    )  # fmt: skip
    out, weights = run(call, b)
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
    weights = dict(w_q=w_q, w_k=w_k, w_v=w_v)  # refused by explain for kind="dot"
    return explain(
        kind, q, k, v, mask, scale=scale, dropout_p=dropout_p, return_weights=return_weights,
        backend=backend, softcap=softcap, sinks=sinks, **weights,
    )  # fmt: skip


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
    call, b, _ = parse(
        "gqa", q, k, v, mask, scale=scale, dropout_p=dropout_p, return_weights=return_weights,
        backend=backend, softcap=softcap, sinks=sinks,
    )  # fmt: skip
    out, weights = run(call, b)
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
    call, b, _ = parse(
        "multi-head", query, key, value, mask, num_heads=num_heads, num_kv_heads=num_kv_heads,
        w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, b_q=b_q, b_k=b_k, b_v=b_v, b_o=b_o, scale=scale,
        dropout_p=dropout_p, return_weights=return_weights, average_weights=average_weights,
        backend=backend, softcap=softcap, sinks=sinks,
    )  # fmt: skip
    out, weights = run(call, b)
    out = linear(merge_heads(out), w_o, b_o)
    if weights is not None and average_weights:
        weights = weights.mean(dim=1)
    return out, weights
