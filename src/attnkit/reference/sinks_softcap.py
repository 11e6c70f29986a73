"""Scaled dot-product attention with attention-logit softcapping (Gemma 2) and attention sinks
(gpt-oss), step by step.

Steps: scores S = Q Kᵀ; scaled = S * scale; capped = c * tanh(scaled / c) (softcapping, before
any mask or bias); masked = capped + M (-inf where not allowed); combined = masked with the
head's sink logit appended to every row; softmax of each combined row; the sink column is
dropped: weights = softmax(combined)[..., :Lk]; output = weights V. A row with no allowed key
puts all of its weight on the sink, so its weights and output are 0.
"""

from __future__ import annotations

import math

import numpy as np

from attnkit import checks
from attnkit.reference.inputs import as_float_array, check_qkv, mask_arrays
from attnkit.reference.steps import check_scores, softmax_rows, transpose
from attnkit.reference.traces import SinkTrace

__all__ = ["scaled_dot_product_sinks"]


def _sinks(sinks: object, q: np.ndarray) -> np.ndarray | None:
    """``sinks`` as a float64 (H,) array for Q (..., H, Lq, d_k), or None."""
    if sinks is None:
        return None
    s = as_float_array("sinks", sinks)
    if q.ndim < 3 or s.shape != (q.shape[-3],):
        raise ValueError(
            f"sinks: expected shape (H,) with Q (..., H, Lq, d_k), got sinks {s.shape} "
            f"and Q {q.shape}"
        )
    return s


def scaled_dot_product_sinks(
    Q: object,
    K: object,
    V: object,
    mask: object = None,
    scale: float | None = None,
    *,
    softcap: float | None = None,
    sinks: object = None,
) -> SinkTrace:
    """softmax([c tanh(Q Kᵀ scale / c) + M, sink_h])[..., :Lk] V, step by step.

    Args:
        Q: (..., H, Lq, d_k); K: (..., H, Lk, d_k); V: (..., H, Lk, d_v) (Q: (..., Lq, d_k)
            when ``sinks`` is None).
        mask: bool or float array broadcastable to (..., Lq, Lk) (see :mod:`attnkit.reference`).
        scale: finite factor; default 1/sqrt(d_k).
        softcap: the cap c > 0, or None (no cap).
        sinks: (H,) one logit per query head, or None (no sink).
    Returns:
        :class:`SinkTrace`; ``output`` (..., Lq, d_v), ``weights`` (..., Lq, Lk).
    """
    q, k, v = check_qkv(Q, K, V, same_width=True)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else checks.finite_float("scale", scale)
    cap = None if softcap is None else checks.positive_float("softcap", softcap)
    sink = _sinks(sinks, q)
    scores = q @ transpose(k)  # S_ij = Q_i . K_j
    scaled = scores * s
    capped = scaled if cap is None else cap * np.tanh(scaled / cap)
    allowed, bias = mask_arrays(mask, scores.shape)
    check_scores(capped + bias, allowed)
    masked = np.where(allowed, capped + bias, -np.inf)
    column = np.full(masked.shape[:-1] + (1,), -np.inf)  # no sink: weight exp(-inf) = 0
    if sink is not None:
        column[...] = sink[:, None, None]  # every row i of head h gets sink_h
    combined = np.concatenate([masked, column], axis=-1)
    probs = softmax_rows(combined)
    weights, sink_weights = probs[..., :-1], probs[..., -1:]
    return SinkTrace(
        q=q,
        k=k,
        v=v,
        scores=scores,
        scale=s,
        scaled=scaled,
        allowed=allowed,
        masked=masked,
        weights=weights,
        output=weights @ v,
        softcap=cap,
        capped=capped,
        sinks=sink,
        combined=combined,
        sink_weights=sink_weights,
    )
