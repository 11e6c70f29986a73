"""The float64 NumPy oracle: attention computed step by step, every intermediate kept.

Every other implementation in attnkit is tested against this module. It follows the seeds'
steps literally and prefers clarity over speed: project, score, scale, mask, softmax row by row,
weighted sum of the values. It never imports torch.

Shape legend
------------
``...``   leading batch dims (batch, heads, ...), identical for Q, K and V (never broadcast)
``Lq``    number of queries, ``i`` a query (a word asking, seed 000's "on")
``Lk``    number of keys / values, ``j`` a key (a word being looked at)
``d_k``   query/key width, ``d_v`` value width, ``d_q`` query width when it differs from d_k
``h``     hidden width of additive attention
``d_model`` embedding width of X, ``H`` number of heads, ``d_out`` width after W^O

Masks
-----
``mask`` is a NumPy array that broadcasts (NumPy's right-aligned rules) to (..., Lq, Lk):

* bool: True = query i may attend to key j (the convention everywhere in attnkit);
* float: *added* to the scaled scores (seed 001's ``M``); ``-inf`` disallows a key, finite
  values shift the score.

A query row with no allowed key at all gets weights 0 and output 0 (the softmax of an empty set
is undefined; 0 is what every attnkit backend returns too), never NaN.

Mask objects from :mod:`attnkit.masks` are torch objects; convert them with
``mask.materialize(Lq, Lk).numpy()`` (and add ``materialize_bias`` for biased masks). Their batch
dims line up with the *leading* batch dims of the inputs, so insert singleton dims after them
before handing them to this module.

Every function returns a frozen dataclass (:class:`Trace` or a subclass) whose arrays are
read-only float64 copies.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "AdditiveTrace",
    "GeneralTrace",
    "MultiHeadTrace",
    "PositionsTrace",
    "SelfAttentionTrace",
    "Trace",
    "additive",
    "dot_product",
    "general",
    "multi_head",
    "scaled_dot_product",
    "self_attention",
    "sinusoidal_positions",
    "softmax_rows",
]


# ---------------------------------------------------------------------------------------------
# traces
# ---------------------------------------------------------------------------------------------
class _Frozen:
    """Makes every ndarray field read-only once the dataclass is built."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                value.flags.writeable = False


@dataclass(frozen=True)
class Trace(_Frozen):
    """Every step of one attention computation (float64, read-only).

    Attributes:
        q: (..., Lq, d_k) queries.
        k: (..., Lk, d_k) keys.
        v: (..., Lk, d_v) values.
        scores: (..., Lq, Lk) raw similarity e_ij (Q Kᵀ for dot products).
        scale: the factor applied to the scores (1/sqrt(d_k), or 1).
        scaled: (..., Lq, Lk) scores * scale.
        allowed: (..., Lq, Lk) bool, True where query i may attend to key j.
        masked: (..., Lq, Lk) scaled + float mask, and -inf where not allowed.
        weights: (..., Lq, Lk) row-wise softmax of ``masked``; every row sums to 1, except rows
            with no allowed key, which are all 0.
        output: (..., Lq, d_v) weights @ V: row i is sum_j weights[i, j] V_j.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scores: np.ndarray
    scale: float
    scaled: np.ndarray
    allowed: np.ndarray
    masked: np.ndarray
    weights: np.ndarray
    output: np.ndarray


@dataclass(frozen=True)
class AdditiveTrace(Trace):
    """:class:`Trace` of additive attention, plus its feed-forward intermediates.

    Attributes:
        q_proj: (..., Lq, h) W_q q_i for every query.
        k_proj: (..., Lk, h) W_k k_j for every key.
        hidden: (..., Lq, Lk, h) tanh(W_q q_i + W_k k_j).
    """

    q_proj: np.ndarray
    k_proj: np.ndarray
    hidden: np.ndarray


@dataclass(frozen=True)
class GeneralTrace(Trace):
    """:class:`Trace` of Luong's general attention, plus ``q_w`` (..., Lq, d_k) = Q W."""

    q_w: np.ndarray


@dataclass(frozen=True)
class SelfAttentionTrace(Trace):
    """:class:`Trace` of self-attention, plus the input ``x`` (..., L, d_model)."""

    x: np.ndarray


@dataclass(frozen=True)
class MultiHeadTrace(Trace):
    """Multi-head attention: the per-head traces stacked, the concatenation and W^O.

    The :class:`Trace` fields hold every head at once, with a head axis before the last two:
    ``q`` (..., H, Lq, d_k), ``k`` (..., H, Lk, d_k), ``v`` (..., H, Lk, d_v), ``scores`` ...
    ``weights`` (..., H, Lq, Lk); ``output`` (..., Lq, d_out) is the final result.

    Attributes:
        heads: one :class:`Trace` per head (head_i = Attention(X_q W^Q_i, X_kv W^K_i, X_kv W^V_i)).
        concat: (..., Lq, H*d_v) Concat(head_1, ..., head_H).
    """

    heads: tuple[Trace, ...]
    concat: np.ndarray


@dataclass(frozen=True)
class PositionsTrace(_Frozen):
    """Sinusoidal position encoding (seed 003).

    Attributes:
        positions: (n,) pos = 0 .. n-1.
        exponents: (d,) 2i/d for column c = 2i or 2i+1.
        angles: (n, d) pos / 10000^(2i/d).
        output: (n, d) sin(angle) in even columns, cos(angle) in odd columns.
    """

    positions: np.ndarray
    exponents: np.ndarray
    angles: np.ndarray
    output: np.ndarray


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
def _as_float_array(name: str, x: object) -> np.ndarray:
    """A float64 copy of ``x``; real numbers only (ints and floats), finite."""
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name}: expected an array of real numbers, got {type(x).__name__}")
    try:
        a = np.array(x)
    except (ValueError, TypeError) as e:
        raise TypeError(f"{name}: expected an array of real numbers, got {type(x).__name__}") from e
    if a.dtype == np.bool_ or not (
        np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
    ):
        raise TypeError(f"{name}: expected an array of real numbers, got dtype {a.dtype}")
    a = a.astype(np.float64)
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: expected finite values, got NaN or inf")
    return a


def _as_matrix_batch(name: str, x: object, what: str) -> np.ndarray:
    """A float64 array of shape (..., L, d) with non-empty dims."""
    a = _as_float_array(name, x)
    if a.ndim < 2:
        raise ValueError(f"{name}: expected shape {what} with at least 2 dims, got {a.shape}")
    if 0 in a.shape:
        raise ValueError(f"{name}: expected non-empty dims, got shape {a.shape}")
    return a


def _check_qkv(
    Q: object, K: object, V: object, same_width: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = _as_matrix_batch("Q", Q, "(..., Lq, d_k)")
    k = _as_matrix_batch("K", K, "(..., Lk, d_k)")
    v = _as_matrix_batch("V", V, "(..., Lk, d_v)")
    for name, a in (("K", k), ("V", v)):
        if a.shape[:-2] != q.shape[:-2]:
            raise ValueError(
                f"{name}: expected batch dims {q.shape[:-2]} like Q {q.shape}, got {a.shape}"
            )
    if same_width and k.shape[-1] != q.shape[-1]:
        raise ValueError(f"K: expected last dim d_k = {q.shape[-1]} like Q, got shape {k.shape}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"V: expected Lk = {k.shape[-2]} rows like K, got shape {v.shape}")
    return q, k, v


def _check_weight(name: str, w: object, shape: tuple[int, ...], what: str) -> np.ndarray:
    a = _as_float_array(name, w)
    if a.shape != shape:
        raise ValueError(f"{name}: expected shape {what} = {shape}, got {a.shape}")
    return a


def _check_scale(scale: object) -> float:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a positive finite number or None, got {scale!r}")
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale: expected a positive finite number or None, got {scale!r}")
    return s


def _check_positive_int(name: str, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name}: expected a positive int, got {n!r}")
    if n < 1:
        raise ValueError(f"{name}: expected a positive int, got {n!r}")
    return int(n)


def _mask_arrays(mask: object, target: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(allowed bool, bias float64), both of shape ``target`` = (..., Lq, Lk)."""
    if mask is None:
        return np.ones(target, dtype=bool), np.zeros(target)
    if isinstance(mask, (str, bytes)):
        raise TypeError(f"mask: expected a bool or float array, got {type(mask).__name__}")
    m = np.asarray(mask)
    if m.dtype != np.bool_ and not np.issubdtype(m.dtype, np.floating):
        raise TypeError(
            f"mask: expected a bool array (True = may attend) or a float array (added to the "
            f"scores), got dtype {m.dtype}"
        )
    fits = 2 <= m.ndim <= len(target)
    fits = fits and all(
        a in (1, b) for a, b in zip(m.shape, target[len(target) - m.ndim :], strict=True)
    )
    if not fits:
        raise ValueError(
            f"mask: expected a shape broadcastable to (..., Lq, Lk) = {target}, got {m.shape}"
        )
    m = np.broadcast_to(m, target)
    if m.dtype == np.bool_:
        return m.copy(), np.zeros(target)
    m = m.astype(np.float64)
    if np.isnan(m).any() or (m == np.inf).any():
        raise ValueError("mask: a float mask may hold finite values and -inf, got NaN or +inf")
    allowed = m != -np.inf
    return allowed, np.where(allowed, m, 0.0)


# ---------------------------------------------------------------------------------------------
# the steps
# ---------------------------------------------------------------------------------------------
def softmax_rows(masked: np.ndarray) -> np.ndarray:
    """Softmax of every row (last axis) of ``masked`` (..., Lq, Lk), seed 000 section 4.2.

    w_ij = exp(s_ij) / sum_l exp(s_il), computed as exp(s_ij - max_l s_il) / sum(...) (the same
    value, without overflow). Entries equal to -inf get weight 0; a row that is -inf everywhere
    (no allowed key) gets weights 0 everywhere instead of 0/0.
    """
    row_max = masked.max(axis=-1, keepdims=True)
    row_has_key = np.isfinite(row_max)
    shift = np.where(row_has_key, row_max, 0.0)
    e = np.exp(masked - shift)  # exp(-inf) = 0 for disallowed keys
    total = e.sum(axis=-1, keepdims=True)
    return np.where(row_has_key, e / np.where(row_has_key, total, 1.0), 0.0)


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scores: np.ndarray,
    scale: float,
    mask: object,
) -> dict:
    """The steps shared by every score kind: scale, mask, softmax, weighted sum."""
    scaled = scores * scale
    allowed, bias = _mask_arrays(mask, scores.shape)
    masked = np.where(allowed, scaled + bias, -np.inf)
    weights = softmax_rows(masked)
    output = weights @ v  # row i: sum_j w_ij V_j
    return dict(
        q=q,
        k=k,
        v=v,
        scores=scores,
        scale=scale,
        scaled=scaled,
        allowed=allowed,
        masked=masked,
        weights=weights,
        output=output,
    )


def _transpose(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


# ---------------------------------------------------------------------------------------------
# public functions
# ---------------------------------------------------------------------------------------------
def scaled_dot_product(
    Q: object, K: object, V: object, mask: object = None, scale: float | None = None
) -> Trace:
    """Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k) + M) V (seeds 000, 001, 002).

    Steps (seed 002): scores S = Q Kᵀ; scaled = S / sqrt(d_k) (or S * ``scale``); masked =
    scaled + M (bool mask: -inf where False); A = softmax(masked) row by row; output = A V.

    Args:
        Q: (..., Lq, d_k); K: (..., Lk, d_k); V: (..., Lk, d_v) real numbers.
        mask: bool or float array broadcastable to (..., Lq, Lk) (module docstring), or None.
        scale: positive finite factor; default 1/sqrt(d_k).
    Returns:
        :class:`Trace`; ``output`` (..., Lq, d_v), ``weights`` (..., Lq, Lk).
    """
    q, k, v = _check_qkv(Q, K, V, same_width=True)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _check_scale(scale)
    scores = q @ _transpose(k)  # S_ij = Q_i . K_j
    return Trace(**_attend(q, k, v, scores, s, mask))


def dot_product(Q: object, K: object, V: object, mask: object = None) -> Trace:
    """Unscaled dot-product attention softmax(Q Kᵀ + M) V (seed 004, seed 001's S_ij).

    Shapes and mask as in :func:`scaled_dot_product`; ``scale`` is 1.
    """
    q, k, v = _check_qkv(Q, K, V, same_width=True)
    return Trace(**_attend(q, k, v, q @ _transpose(k), 1.0, mask))


def additive(
    Q: object,
    K: object,
    V: object,
    W_q: object,
    W_k: object,
    w_v: object,
    mask: object = None,
) -> AdditiveTrace:
    """Additive (Bahdanau) attention (seed 004).

    e_ij = w_vᵀ tanh(W_q Q_i + W_k K_j); alpha_ij = exp(e_ij) / sum_l exp(e_il) (over allowed
    keys, after adding a float mask); output_i = sum_j alpha_ij V_j. No scaling (scale = 1).

    Args:
        Q: (..., Lq, d_q); K: (..., Lk, d_k); V: (..., Lk, d_v).
        W_q: (h, d_q); W_k: (h, d_k); w_v: (h,).
        mask: as in :func:`scaled_dot_product`.
    Returns:
        :class:`AdditiveTrace` (``hidden`` (..., Lq, Lk, h) is the tanh layer).
    """
    q, k, v = _check_qkv(Q, K, V, same_width=False)
    wv = _as_float_array("w_v", w_v)
    if wv.ndim != 1 or wv.shape[0] < 1:
        raise ValueError(f"w_v: expected shape (h,) with h >= 1, got {wv.shape}")
    h = wv.shape[0]
    wq = _check_weight("W_q", W_q, (h, q.shape[-1]), "(h, d_q)")
    wk = _check_weight("W_k", W_k, (h, k.shape[-1]), "(h, d_k)")
    q_proj = q @ wq.T  # row i: W_q Q_i
    k_proj = k @ wk.T  # row j: W_k K_j
    hidden = np.tanh(q_proj[..., :, None, :] + k_proj[..., None, :, :])  # (..., Lq, Lk, h)
    scores = hidden @ wv  # e_ij = w_v . hidden_ij
    return AdditiveTrace(
        **_attend(q, k, v, scores, 1.0, mask), q_proj=q_proj, k_proj=k_proj, hidden=hidden
    )


def general(Q: object, K: object, V: object, W: object, mask: object = None) -> GeneralTrace:
    """Luong's general (bilinear) attention: e_ij = Q_i W K_jᵀ, softmax, weighted sum of V.

    Args:
        Q: (..., Lq, d_q); K: (..., Lk, d_k); V: (..., Lk, d_v); W: (d_q, d_k).
        mask: as in :func:`scaled_dot_product`.
    Returns:
        :class:`GeneralTrace`; ``q_w`` (..., Lq, d_k) = Q W, scale 1.
    """
    q, k, v = _check_qkv(Q, K, V, same_width=False)
    w = _check_weight("W", W, (q.shape[-1], k.shape[-1]), "(d_q, d_k)")
    q_w = q @ w
    scores = q_w @ _transpose(k)
    return GeneralTrace(**_attend(q, k, v, scores, 1.0, mask), q_w=q_w)


def self_attention(
    X: object, W_q: object, W_k: object, W_v: object, mask: object = None
) -> SelfAttentionTrace:
    """Self-attention (seeds 000 and 002): Q = X W^Q, K = X W^K, V = X W^V, then
    softmax(Q Kᵀ / sqrt(d_k) + M) V.

    Seed layout: a word's embedding is a row of X and its query is that row times W^Q.

    Args:
        X: (..., L, d_model); W_q: (d_model, d_k); W_k: (d_model, d_k); W_v: (d_model, d_v).
        mask: broadcastable to (..., L, L), as in :func:`scaled_dot_product`.
    Returns:
        :class:`SelfAttentionTrace`; ``output`` (..., L, d_v).
    """
    x = _as_matrix_batch("X", X, "(..., L, d_model)")
    d_model = x.shape[-1]
    wq = _as_float_array("W_q", W_q)
    if wq.ndim != 2 or wq.shape[0] != d_model or wq.shape[1] < 1:
        raise ValueError(
            f"W_q: expected shape (d_model, d_k) with d_model = {d_model}, got {wq.shape}"
        )
    d_k = wq.shape[1]
    wk = _check_weight("W_k", W_k, (d_model, d_k), "(d_model, d_k)")
    wv = _as_float_array("W_v", W_v)
    if wv.ndim != 2 or wv.shape[0] != d_model or wv.shape[1] < 1:
        raise ValueError(
            f"W_v: expected shape (d_model, d_v) with d_model = {d_model}, got {wv.shape}"
        )
    t = scaled_dot_product(x @ wq, x @ wk, x @ wv, mask)
    return SelfAttentionTrace(**{f.name: getattr(t, f.name) for f in fields(t)}, x=x)


def multi_head(
    X_q: object,
    X_kv: object,
    W_q: object,
    W_k: object,
    W_v: object,
    W_o: object,
    num_heads: int,
    mask: object = None,
) -> MultiHeadTrace:
    """MultiHead = Concat(head_1, ..., head_H) W^O, head_i = Attention(X_q W^Q_i, X_kv W^K_i,
    X_kv W^V_i) with scaled dot-product attention (seed 001; self-attention when X_q is X_kv).

    The per-head projections are the column blocks of the stacked matrices (X @ W layout):
    W^Q_i = W_q[:, i*d_k:(i+1)*d_k], and likewise W^K_i, W^V_i (d_v columns each).

    Args:
        X_q: (..., Lq, d_model); X_kv: (..., Lk, d_kv) with the same batch dims.
        W_q: (d_model, H*d_k); W_k: (d_kv, H*d_k); W_v: (d_kv, H*d_v); W_o: (H*d_v, d_out).
        num_heads: H.
        mask: broadcastable to (..., H, Lq, Lk) (right-aligned: (Lq, Lk) applies to every head
            and batch element, (H, Lq, Lk) per head, (B, 1, Lq, Lk) per batch element).
    Returns:
        :class:`MultiHeadTrace`; ``output`` (..., Lq, d_out), ``weights`` (..., H, Lq, Lk).
    """
    xq = _as_matrix_batch("X_q", X_q, "(..., Lq, d_model)")
    xkv = _as_matrix_batch("X_kv", X_kv, "(..., Lk, d_kv)")
    if xkv.shape[:-2] != xq.shape[:-2]:
        raise ValueError(f"X_kv: expected batch dims {xq.shape[:-2]} like X_q, got {xkv.shape}")
    H = _check_positive_int("num_heads", num_heads)
    mats = {}
    for name, w, rows, what in (
        ("W_q", W_q, xq.shape[-1], "(d_model, H*d_k)"),
        ("W_k", W_k, xkv.shape[-1], "(d_kv, H*d_k)"),
        ("W_v", W_v, xkv.shape[-1], "(d_kv, H*d_v)"),
    ):
        a = _as_float_array(name, w)
        if a.ndim != 2 or a.shape[0] != rows or a.shape[1] < H or a.shape[1] % H:
            raise ValueError(
                f"{name}: expected shape {what} with {rows} rows and columns a multiple of "
                f"num_heads = {H}, got {a.shape}"
            )
        mats[name] = a
    wq, wk, wv = mats["W_q"], mats["W_k"], mats["W_v"]
    d_k, d_v = wq.shape[1] // H, wv.shape[1] // H
    if wk.shape[1] != H * d_k:
        raise ValueError(f"W_k: expected {H * d_k} columns (H*d_k) like W_q, got {wk.shape}")
    wo = _as_float_array("W_o", W_o)
    if wo.ndim != 2 or wo.shape[0] != H * d_v or wo.shape[1] < 1:
        raise ValueError(
            f"W_o: expected shape (H*d_v, d_out) with H*d_v = {H * d_v}, got {wo.shape}"
        )
    batch, lq, lk = xq.shape[:-2], xq.shape[-2], xkv.shape[-2]
    allowed, bias = _mask_arrays(mask, batch + (H, lq, lk))
    head_mask = np.where(allowed, bias, -np.inf)  # one float mask carries both parts
    heads = []
    for i in range(H):
        qi = xq @ wq[:, i * d_k : (i + 1) * d_k]
        ki = xkv @ wk[:, i * d_k : (i + 1) * d_k]
        vi = xkv @ wv[:, i * d_v : (i + 1) * d_v]
        heads.append(scaled_dot_product(qi, ki, vi, head_mask[..., i, :, :]))
    concat = np.concatenate([t.output for t in heads], axis=-1)  # (..., Lq, H*d_v)
    output = concat @ wo
    stacked = {
        f.name: np.stack([getattr(t, f.name) for t in heads], axis=-3)
        for f in fields(Trace)
        if f.name not in ("scale", "output")
    }
    return MultiHeadTrace(
        **stacked,
        scale=heads[0].scale,
        output=output,
        heads=tuple(heads),
        concat=concat,
    )


def sinusoidal_positions(n: int, d: int) -> PositionsTrace:
    """Sinusoidal position encoding (seed 003; Vaswani et al.).

    PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) for
    pos = 0 .. n-1. Column c uses i = c // 2, so for odd d the last column is a sine.

    Args:
        n: number of positions (>= 1); d: encoding width (>= 1).
    Returns:
        :class:`PositionsTrace`; ``output`` (n, d).
    """
    n = _check_positive_int("n", n)
    d = _check_positive_int("d", d)
    positions = np.arange(n, dtype=np.float64)
    columns = np.arange(d)
    exponents = 2 * (columns // 2) / d  # 2i/d for column 2i and 2i+1
    angles = positions[:, None] / np.power(10000.0, exponents)[None, :]
    output = np.where(columns % 2 == 0, np.sin(angles), np.cos(angles))
    return PositionsTrace(positions=positions, exponents=exponents, angles=angles, output=output)
