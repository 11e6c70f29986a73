"""The reference's input checks: arrays of real numbers copied to float64, shapes (..., L, d),
weights, and a mask turned into (allowed, bias) arrays. Errors name the argument as the caller
passed it (``Q``, ``W_k``, ``mask``); wrong type -> TypeError, wrong value -> ValueError."""

from __future__ import annotations

import numpy as np

__all__ = ["as_float_array", "as_matrix_batch", "check_qkv", "check_weight", "mask_arrays"]


def as_float_array(name: str, x: object) -> np.ndarray:
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


def as_matrix_batch(name: str, x: object, what: str) -> np.ndarray:
    """A float64 array of shape (..., L, d) with non-empty dims; ``what`` describes the shape."""
    a = as_float_array(name, x)
    if a.ndim < 2:
        raise ValueError(f"{name}: expected shape {what} with at least 2 dims, got {a.shape}")
    if 0 in a.shape:
        raise ValueError(f"{name}: expected non-empty dims, got shape {a.shape}")
    return a


def check_qkv(
    Q: object, K: object, V: object, same_width: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q (..., Lq, d_k), K (..., Lk, d_k or any width unless ``same_width``), V (..., Lk, d_v)
    with identical batch dims, as float64 arrays."""
    q = as_matrix_batch("Q", Q, "(..., Lq, d_k)")
    k = as_matrix_batch("K", K, "(..., Lk, d_k)")
    v = as_matrix_batch("V", V, "(..., Lk, d_v)")
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


def check_weight(name: str, w: object, shape: tuple[int, ...], what: str) -> np.ndarray:
    """A float64 weight of exactly ``shape`` (``what`` names its dims in the message)."""
    a = as_float_array(name, w)
    if a.shape != shape:
        raise ValueError(f"{name}: expected shape {what} = {shape}, got {a.shape}")
    return a


def mask_arrays(mask: object, target: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(allowed bool, bias float64), both of shape ``target`` = (..., Lq, Lk).

    ``mask``: None, a bool array (True = may attend) or a float array (added to the scores;
    -inf disallows), broadcastable right-aligned to ``target``."""
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
