"""The steps every score kind shares (seed 000 section 4, seed 002): scale, mask, softmax row
by row, weighted sum of the values."""

from __future__ import annotations

import numpy as np

from attnkit.reference.inputs import mask_arrays

__all__ = ["attend", "check_scores", "softmax_rows", "transpose"]


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


def check_scores(values: np.ndarray, allowed: np.ndarray) -> None:
    """ValueError when an allowed score (scaled, plus any bias) is not finite: finite Q and K
    whose scores overflow float64. Its softmax would otherwise read +inf or NaN as a row
    without keys and give weights 0, which is not the result; float64 cannot represent it."""
    bad = allowed & ~np.isfinite(values)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"Q, K: expected scores within float64's range, got {values[at]} at index {at} "
            "(Q Kᵀ * scale + bias overflows float64); scale the inputs down"
        )


def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scores: np.ndarray,
    scale: float,
    mask: object,
) -> dict:
    """From raw scores (..., Lq, Lk) to every :class:`~attnkit.reference.traces.Trace` field:
    scale, mask (module docstring of :mod:`attnkit.reference`), softmax, weighted sum."""
    scaled = scores * scale
    allowed, bias = mask_arrays(mask, scores.shape)
    check_scores(scaled + bias, allowed)
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


def transpose(a: np.ndarray) -> np.ndarray:
    """Swap the last two axes: (..., L, d) -> (..., d, L)."""
    return np.swapaxes(a, -1, -2)
