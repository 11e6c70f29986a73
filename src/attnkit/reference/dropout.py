"""Attention dropout with a counter-based keep mask (the ``blocksparse`` backend's dropout).

out = (softmax(s) * keep / (1 - p)) V: dropout on the attention weights after the softmax
normalisation, as torch's ``scaled_dot_product_attention(dropout_p=p)``. ``keep`` is a pure
function of (seed, bh, i, j): ``bh`` the flat row-major index over the batch dims (..., H) of
the queries, ``i`` the query, ``j`` the key, all counted from 0. In uint64 arithmetic (mod
2**64, logical shifts), with mix = splitmix64's finaliser::

    mix(z)   = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
               z ^ (z >> 31)
    row      = mix(mix(seed + (bh + 1) * 0x9E3779B97F4A7C15) + (i + 1) * 0x9E3779B97F4A7C15)
    u        = mix(row + (j // 4 + 1) * 0xD1B54A32D192ED03)
    word     = (u >> (16 * (j % 4))) & 0xFFFF
    keep     = word >= round(p * 2**16)

This module regenerates the mask densely in NumPy; it never imports torch.

Shape legend: ``...`` batch dims (with heads), ``Lq``/``Lk`` query/key lengths, ``d_v`` width.
"""

from __future__ import annotations

import numpy as np

from attnkit import checks

__all__ = ["dropout_output", "keep_mask"]

_U = np.uint64


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping multiplication)."""
    z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
    return z ^ (z >> _U(31))


def keep_mask(seed: int, batch_shape: tuple[int, ...], q_len: int, kv_len: int, p: float):
    """The keep mask, bool (*batch_shape, Lq, Lk): True where the weight survives dropout.

    Args:
        seed: the call's seed, an int in [0, 2**62] (:func:`attnkit.checks.nonnegative_int`).
        batch_shape: the batch dims of the queries, heads included (..., H).
        q_len, kv_len: Lq, Lk.
        p: the dropout probability in [0, 1].
    """
    seed = checks.nonnegative_int("seed", seed)
    p = checks.probability("p", p)
    n = int(np.prod(batch_shape, dtype=np.int64))
    golden = _U(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        bh = np.arange(1, n + 1, dtype=_U)[:, None, None]
        i = np.arange(1, q_len + 1, dtype=_U)[None, :, None]
        j = np.arange(kv_len, dtype=_U)[None, None, :]
        row = _mix(_mix(_U(seed) + bh * golden) + i * golden)
        u = _mix(row + (j // _U(4) + _U(1)) * _U(0xD1B54A32D192ED03))
    word = (u >> (_U(16) * (j % _U(4)))) & _U(0xFFFF)
    keep = word >= _U(round(p * 2**16))
    return keep.reshape(tuple(batch_shape) + (q_len, kv_len))


def dropout_output(weights: np.ndarray, v: np.ndarray, keep: np.ndarray, p: float) -> np.ndarray:
    """(weights * keep / (1 - p)) @ v: weights (..., Lq, Lk) after the softmax (a reference
    trace's ``weights``), v (..., Lk, d_v), keep bool (..., Lq, Lk) -> (..., Lq, d_v)."""
    p = checks.probability("p", p)
    return (np.where(keep, weights, 0.0) / (1.0 - p)) @ v
