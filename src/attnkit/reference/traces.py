"""The records the float64 reference returns: one frozen dataclass per attention kind, every
intermediate kept as a read-only float64 array (see :mod:`attnkit.reference` for the shape
legend)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "AdditiveTrace",
    "GeneralTrace",
    "MultiHeadTrace",
    "PositionsTrace",
    "SelfAttentionTrace",
    "SinkTrace",
    "Trace",
]


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
class SinkTrace(Trace):
    """:class:`Trace` of scaled dot-product attention with logit softcapping and attention
    sinks (Gemma 2, gpt-oss). ``masked`` is ``capped`` + bias, -inf where not allowed;
    ``weights`` leave the sink out (a row sums to 1 - ``sink_weights``).

    Attributes:
        softcap: the cap c, or None (then ``capped`` equals ``scaled``).
        capped: (..., H, Lq, Lk) c * tanh(scaled / c).
        sinks: (H,) one logit per query head, or None (then ``sink_weights`` are 0).
        combined: (..., H, Lq, Lk + 1) ``masked`` with the head's sink logit appended to
            every row.
        sink_weights: (..., H, Lq, 1) the softmax weight of the sink column, dropped.
    """

    softcap: float | None
    capped: np.ndarray
    sinks: np.ndarray | None
    combined: np.ndarray
    sink_weights: np.ndarray


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
