"""Public attention functions: validate every argument, then dispatch to a backend.

Shape legend
------------
``...``  batch dims (batch, heads, ...), identical for q, k and v (never broadcast silently)
``Lq``   query length          ``Lk``  key/value length
``dk``   query/key width       ``dv``  value width       ``h``  additive hidden width

Masks: a mask object from :mod:`attnkit.masks` (True = may attend; batch data lines up with the
leading batch dim), or a tensor broadcastable to (..., Lq, Lk) with torch's right-aligned rules:
bool (True = may attend) or float (added to the scores; ``-inf`` disallows).

Fully masked rows: a query row with no allowed key gets output 0 and weights 0 (never NaN), in
every backend and in :mod:`attnkit.reference`.

Backends: ``backend="auto"`` picks the first backend in preference order that can serve the
call; :func:`explain_dispatch` says which and why each other one was rejected; ``backend=NAME``
forces one and raises ``ValueError`` with its reasons when it cannot serve the call.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit import kernels
from attnkit.kernels.base import WEIGHTS_LIMIT, AttentionCall
from attnkit.masks import Mask, from_tensor

__all__ = [
    "Dispatch",
    "additive_attention",
    "dot_product_attention",
    "explain_dispatch",
    "general_attention",
    "multi_head_attention",
    "scaled_dot_product_attention",
]


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
def _check_tensor(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    return t


def _check_like(name: str, t: Tensor, ref: Tensor, ref_name: str = "q") -> None:
    if t.dtype != ref.dtype:
        raise TypeError(f"{name}: expected dtype {ref.dtype} like {ref_name}, got {t.dtype}")
    if t.device != ref.device:
        raise ValueError(f"{name}: expected device {ref.device} like {ref_name}, got {t.device}")


def _check_qkv(q: object, k: object, v: object, same_width: bool) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v = _check_tensor("q", q), _check_tensor("k", k), _check_tensor("v", v)
    _check_like("k", k, q)
    _check_like("v", v, q)
    if q.dim() < 2:
        raise ValueError(
            f"q: expected shape (..., Lq, d_k) with at least 2 dims, got {tuple(q.shape)}"
        )
    for name, t, what in (("k", k, "(..., Lk, d_k)"), ("v", v, "(..., Lk, d_v)")):
        if t.dim() != q.dim():
            raise ValueError(
                f"{name}: expected {q.dim()} dims {what} like q {tuple(q.shape)}, "
                f"got {tuple(t.shape)}"
            )
        if t.shape[:-2] != q.shape[:-2]:
            raise ValueError(
                f"{name}: batch dims {tuple(t.shape[:-2])} do not match q's {tuple(q.shape[:-2])} "
                "(attnkit does not broadcast batch dims; expand them explicitly)"
            )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if 0 in t.shape:
            raise ValueError(f"{name}: expected non-empty dims, got shape {tuple(t.shape)}")
    if same_width and k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k: expected last dim d_k = {q.shape[-1]} like q, got shape {tuple(k.shape)}"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v: expected Lk = {k.shape[-2]} rows like k, got shape {tuple(v.shape)}")
    return q, k, v


def _normalize_mask(mask: object, q: Tensor, kv_len: int) -> Mask | None:
    """A mask object whose batch_shape lines up with q's leading batch dims, or None."""
    if mask is None:
        return None
    q_len, batch = q.shape[-2], tuple(q.shape[:-2])
    target = batch + (q_len, kv_len)
    if isinstance(mask, Tensor):
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"mask: expected a bool or floating tensor, got dtype {mask.dtype}")
        if mask.device != q.device:
            raise ValueError(f"mask: expected device {q.device} like q, got {mask.device}")
        if (
            mask.dim() < 2
            or mask.dim() > len(target)
            or any(m not in (1, t) for m, t in zip(mask.shape[::-1], target[::-1]))
        ):
            raise ValueError(
                f"mask: expected a shape broadcastable to (..., Lq, Lk) = {target}, "
                f"got {tuple(mask.shape)}"
            )
        full = mask.reshape((1,) * (len(target) - mask.dim()) + tuple(mask.shape))
        full = full.expand(full.shape[:-2] + (q_len, kv_len))
        return from_tensor(full)
    if not isinstance(mask, Mask):
        raise TypeError(
            f"mask: expected a Mask object, a bool/float torch.Tensor or None, "
            f"got {type(mask).__name__}"
        )
    mb = mask.batch_shape
    if len(mb) > len(batch) or any(m not in (1, b) for m, b in zip(mb, batch)):
        raise ValueError(
            f"mask: its batch shape {mb} does not line up with the leading batch dims {batch} "
            f"of q {tuple(q.shape)}"
        )
    mask.tile(0, 1, 0, 1, q_len, kv_len)  # lets the mask check its own lengths now
    return mask


def _check_scale(scale: object, d_k: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a positive finite number or None, got {scale!r}")
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale: expected a positive finite number or None, got {scale!r}")
    return s


def _check_dropout(p: object) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"dropout_p: expected a number in [0, 1), got {p!r}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"dropout_p: expected a number in [0, 1), got {p!r}")
    return float(p)


def _check_flag(name: str, x: object) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected a bool, got {x!r}")
    return x


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dispatch:
    """The backend chosen for a call and, for every backend, why it was not chosen.

    ``chosen`` is None when nothing can serve the call; ``reasons[name]`` is an empty list for a
    backend that could serve it (but came later in preference order)."""

    chosen: str | None
    reasons: dict[str, list[str]]
    requested: str = "auto"

    def __str__(self) -> str:
        lines = [f"backend: {self.chosen or 'none'} (requested: {self.requested})"]
        for name, why in self.reasons.items():
            if name == self.chosen:
                continue
            lines.append(f"  {name}: " + ("; ".join(why) if why else "could serve, lower priority"))
        return "\n".join(lines)


def _dispatch(call: AttentionCall, backend: str) -> Dispatch:
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    names = kernels.preference(call.kind)
    if backend != "auto" and backend not in kernels.BACKENDS:
        raise ValueError(
            f"backend: expected 'auto' or one of {sorted(kernels.BACKENDS)}, got {backend!r}"
        )
    if backend != "auto":
        # a forced backend must be able to serve the call; being slower is the user's choice
        b = kernels.BACKENDS[backend]
        reasons = {backend: b.not_supported_reasons(call)}
        return Dispatch(backend if not reasons[backend] else None, reasons, backend)
    reasons = {}
    for n in names:
        b = kernels.BACKENDS[n]
        reasons[n] = b.not_supported_reasons(call) or b.speed_reasons(call)
    chosen = next((n for n in names if not reasons[n]), None)
    return Dispatch(chosen, reasons, backend)


def _run(call: AttentionCall, backend: str) -> tuple[Tensor, Tensor | None]:
    if call.return_weights and call.weights_numel() > WEIGHTS_LIMIT:
        raise ValueError(
            f"return_weights: the weights would have {call.weights_numel():,} entries "
            f"(> {WEIGHTS_LIMIT:,}); ask for fewer: slice the query rows (q[..., rows, :]) or "
            "the heads you want to see and call again, or call without return_weights"
        )
    d = _dispatch(call, backend)
    if d.chosen is None:
        if backend != "auto":
            raise ValueError(
                f"backend: {backend!r} cannot serve this call: " + "; ".join(d.reasons[backend])
            )
        raise ValueError(f"backend: no backend can serve this call:\n{d}")
    return kernels.BACKENDS[d.chosen].run(call)


def _finish(out: Tensor, weights: Tensor | None, return_weights: bool):
    return (out, weights) if return_weights else out


# ---------------------------------------------------------------------------------------------
# public functions
# ---------------------------------------------------------------------------------------------
def _dot_call(q, k, v, mask, scale, dropout_p, return_weights, default_scale) -> AttentionCall:
    q, k, v = _check_qkv(q, k, v, same_width=True)
    s = _check_scale(scale, q.shape[-1]) if scale is not None or default_scale else 1.0
    return AttentionCall(
        kind="dot",
        q=q,
        k=k,
        v=v,
        mask=_normalize_mask(mask, q, k.shape[-2]),
        scale=s,
        dropout_p=_check_dropout(dropout_p),
        return_weights=_check_flag("return_weights", return_weights),
    )


def _additive_call(q, k, v, w_q, w_k, w_v, mask, return_weights) -> AttentionCall:
    q, k, v = _check_qkv(q, k, v, same_width=False)
    w_q, w_k, w_v = _check_tensor("w_q", w_q), _check_tensor("w_k", w_k), _check_tensor("w_v", w_v)
    for name, t in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        _check_like(name, t, q)
    if w_v.dim() != 1:
        raise ValueError(f"w_v: expected shape (h,), got {tuple(w_v.shape)}")
    h = w_v.shape[0]
    if w_q.shape != (h, q.shape[-1]):
        raise ValueError(
            f"w_q: expected shape (h, d_q) = ({h}, {q.shape[-1]}), got {tuple(w_q.shape)}"
        )
    if w_k.shape != (h, k.shape[-1]):
        raise ValueError(
            f"w_k: expected shape (h, d_k) = ({h}, {k.shape[-1]}), got {tuple(w_k.shape)}"
        )
    return AttentionCall(
        kind="additive",
        q=q,
        k=k,
        v=v,
        mask=_normalize_mask(mask, q, k.shape[-2]),
        return_weights=_check_flag("return_weights", return_weights),
        w_q=w_q,
        w_k=w_k,
        w_v=w_v,
    )


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
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale + mask) v, with scale = 1/sqrt(d_k) unless given.

    Args:
        q: (..., Lq, dk); k: (..., Lk, dk); v: (..., Lk, dv), same dtype, device, batch dims.
        mask: mask object or tensor (see module docstring); True = may attend.
        scale: positive finite float; default 1/sqrt(dk).
        dropout_p: dropout on the weights, in [0, 1).
        return_weights: also return the weights (..., Lq, Lk) (before dropout).
        backend: "auto" or a backend name (``attnkit.kernels.BACKENDS``).

    Returns:
        output (..., Lq, dv), or (output, weights) when ``return_weights``.

    Equivalent to::

        scores = q @ k.transpose(-2, -1) * scale          # (..., Lq, Lk)
        scores = scores + bias; scores[~allowed] = -inf
        w = softmax(scores, -1); w[row has no allowed key] = 0
        out = dropout(w) @ v
    """
    call = _dot_call(q, k, v, mask, scale, dropout_p, return_weights, default_scale=True)
    return _finish(*_run(call, backend), return_weights)


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
    call = _dot_call(q, k, v, mask, 1.0, dropout_p, return_weights, default_scale=False)
    return _finish(*_run(call, backend), return_weights)


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
    q, k, v = _check_qkv(q, k, v, same_width=False)
    w = _check_tensor("w", w)
    _check_like("w", w, q)
    if w.shape != (q.shape[-1], k.shape[-1]):
        raise ValueError(
            f"w: expected shape (d_q, d_k) = ({q.shape[-1]}, {k.shape[-1]}), got {tuple(w.shape)}"
        )
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
    call = _additive_call(q, k, v, w_q, w_k, w_v, mask, return_weights)
    return _finish(*_run(call, backend), return_weights)


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
) -> Dispatch:
    """Which backend would run this call, and why each other backend was rejected.

    ``kind`` is "dot" (scaled / unscaled dot product) or "additive" (then give w_q, w_k, w_v).
    Nothing is computed; ``print(explain_dispatch(...))`` gives a readable report.
    """
    if kind == "dot":
        call = _dot_call(q, k, v, mask, scale, dropout_p, return_weights, default_scale=True)
    elif kind == "additive":
        call = _additive_call(q, k, v, w_q, w_k, w_v, mask, return_weights)
    else:
        raise ValueError(f"kind: expected 'dot' or 'additive', got {kind!r}")
    return _dispatch(call, backend)


def _split_heads(x: Tensor, n: int) -> Tensor:
    """(B, L, n*d) -> (B, n, L, d)."""
    b, length, e = x.shape
    return x.reshape(b, length, n, e // n).transpose(1, 2)


def _proj(name: str, x: Tensor, w: object, b: object, in_dim: int) -> Tensor:
    w = _check_tensor(name, w)
    _check_like(name, w, x, "query")
    if w.dim() != 2 or w.shape[1] != in_dim:
        raise ValueError(f"{name}: expected shape (out, {in_dim}), got {tuple(w.shape)}")
    if b is not None:
        b = _check_tensor(name.replace("w_", "b_"), b)
        _check_like(name.replace("w_", "b_"), b, x, "query")
        if b.shape != (w.shape[0],):
            raise ValueError(
                f"{name.replace('w_', 'b_')}: expected shape ({w.shape[0]},), got {tuple(b.shape)}"
            )
    return torch.nn.functional.linear(x, w, b)


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
    Returns:
        (output (B, Lq, E_out), weights or None).
    """
    query, key, value = (
        _check_tensor(n, t) for n, t in (("query", query), ("key", key), ("value", value))
    )
    for n, t in (("key", key), ("value", value)):
        _check_like(n, t, query, "query")
        if t.dim() != 3:
            raise ValueError(f"{n}: expected shape (B, L, E), got {tuple(t.shape)}")
    if query.dim() != 3:
        raise ValueError(f"query: expected shape (B, Lq, E), got {tuple(query.shape)}")
    if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
        raise ValueError(
            f"key/value: expected (B, Lk, .) with B = {query.shape[0]} and matching Lk, "
            f"got key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads: expected a positive int, got {num_heads!r}")
    g = num_heads if num_kv_heads is None else num_kv_heads
    if not isinstance(g, int) or g < 1 or num_heads % g:
        raise ValueError(
            f"num_kv_heads: expected a positive divisor of num_heads={num_heads}, got {g!r}"
        )
    _check_flag("average_weights", average_weights)
    q = _proj("w_q", query, w_q, b_q, query.shape[-1])
    k = _proj("w_k", key, w_k, b_k, key.shape[-1])
    v = _proj("w_v", value, w_v, b_v, value.shape[-1])
    if q.shape[-1] % num_heads or k.shape[-1] % g or v.shape[-1] % g:
        raise ValueError(
            f"w_q/w_k/w_v: output widths {q.shape[-1]}, {k.shape[-1]}, {v.shape[-1]} must divide "
            f"into {num_heads} query heads and {g} key/value heads"
        )
    q, k, v = _split_heads(q, num_heads), _split_heads(k, g), _split_heads(v, g)
    if g != num_heads:
        k = k.repeat_interleave(num_heads // g, dim=1)
        v = v.repeat_interleave(num_heads // g, dim=1)
    res = scaled_dot_product_attention(
        q,
        k,
        v,
        mask,
        scale=scale,
        dropout_p=dropout_p,
        return_weights=return_weights,
        backend=backend,
    )
    out, weights = res if return_weights else (res, None)
    b, _, lq, dv = out.shape
    out = out.transpose(1, 2).reshape(b, lq, num_heads * dv)
    out = _proj("w_o", out, w_o, b_o, num_heads * dv)
    if weights is not None and average_weights:
        weights = weights.mean(dim=1)
    return out, weights
