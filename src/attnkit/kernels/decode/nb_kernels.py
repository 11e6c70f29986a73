"""numba kernels of the decode step: flash-decoding's split-K in one pass over K and V.

Work unit ``u`` = (row block ``i``, key split ``sp``): the R query rows of one (batch, key/value
head) pair (its grouped query heads folded into the rows) against keys ``sp * chunk ..`` of the
split. A unit reads each of its K rows once for all R rows, computes the R scores of that key,
then reads each V row once::

    s[r, j] = scale * q[i, r] . k[i, j]        (float32 accumulation, K read once)
    m[r] = max_j s[r, j]; p = exp(s - m); l[r] = sum_j p
    acc[r] = sum_j p[r, j] v[i, j]             (V read once)

:func:`combine` then merges the splits of a row block: ``M = max m``, ``L = sum l e^(m - M)``,
``out = sum acc e^(m - M) / L``.

K and V are passed by address with their strides in elements (the last dim contiguous), so a
slice of a cache buffer is read in place; float32 (``*_f32``) or bfloat16 (``*_bf16``: 16-bit
words widened to float32 by a 16-bit shift of their bits, exactly). q is float32, contiguous.

The policy (:mod:`attnkit.kernels.numerics`, P5/P6) is checked as the scores are made: a unit
counts the scores strictly inside ``(-limit, limit)`` (NaN is never inside) and flags itself
when any is not; :func:`combine` flags a non-finite output (a NaN or inf in V reaches it). The
caller redoes a flagged step the exact way. fastmath here leaves out "nnan"/"ninf", so those
checks are compiled as written.

This module imports numba; attnkit loads it only through
:func:`attnkit.kernels.numba_runtime.load_kernels` (on-disk cache of compiled code).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.extending import overload

from attnkit.kernels.nb_memory import bits_to_f32, pointer_f32, pointer_i32, pointer_u16
from attnkit.kernels.nbmath import exp_nonpos_f32

__all__ = ["combine", "partials_bf16", "partials_f32"]

FAST = {"contract", "reassoc", "arcp", "nsz", "afn"}
KERNEL = dict(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
BLOCK = 64
"""Keys per block: each block of K (or V) rows is read from memory once, then from L1 by every
query row of the unit."""
INLINE = dict(fastmath=FAST, error_model="numpy", forceinline=True)


def _widen(x):
    """float32 of a stored element: itself, or a bfloat16's 16 bits shifted into float32's."""


@overload(_widen, inline="always")
def _widen_impl(x):
    if x == types.uint16:
        return lambda x: bits_to_f32(np.int32(x) << np.int32(16))
    return lambda x: x


@njit(**INLINE)
def _unit(q, k, v, ks, vs, m, lsum, acc, bad, u, splits, rows, n, dk, dv, chunk, scale, limit):
    """One work unit (see the module docstring); k, v float32 or bfloat16 bits (uint16)."""
    i, sp = u // splits, u % splits
    j0 = sp * chunk
    c = min(n, j0 + chunk) - j0
    s = np.empty(rows * c, np.float32)
    inside = 0
    for b0 in range(0, c, BLOCK):  # a block of keys stays in L1 while every row reads it
        b1 = min(c, b0 + BLOCK)
        for r in range(rows):
            qr = q[(i * rows + r) * dk : (i * rows + r + 1) * dk]
            for jj in range(b0, b1):
                kb = i * ks[0] + (j0 + jj) * ks[1]
                kr = k[kb : kb + dk]  # a slice: its indices are known >= 0, so loads vectorise
                t = np.float32(0.0)
                for x in range(dk):
                    t += qr[x] * _widen(kr[x])
                t *= scale
                s[r * c + jj] = t
                inside += 1 if abs(t) < limit else 0
    o = u * rows
    for r in range(rows):
        sr = s[r * c : (r + 1) * c]
        mx = sr[0]
        for jj in range(1, c):
            mx = max(mx, sr[jj])
        tot = np.float32(0.0)
        for jj in range(c):
            p = exp_nonpos_f32(sr[jj] - mx)
            sr[jj] = p
            tot += p
        m[o + r] = mx
        lsum[o + r] = tot
    a = np.zeros(rows * dv, np.float32)
    for b0 in range(0, c, BLOCK):
        b1 = min(c, b0 + BLOCK)
        for r in range(rows):
            ar = a[r * dv : (r + 1) * dv]
            for jj in range(b0, b1):
                p = s[r * c + jj]
                vb = i * vs[0] + (j0 + jj) * vs[1]
                vr = v[vb : vb + dv]
                for x in range(dv):
                    ar[x] += p * _widen(vr[x])
    for y in range(rows * dv):
        acc[o * dv + y] = a[y]
    bad[u] = 0 if inside == rows * c else 1


@njit(**INLINE)
def _units(q_addr, k, v, ks, vs, rows, n, dk, dv, chunk, splits, scale, limit,
           m_addr, l_addr, acc_addr, bad_addr, units, first, step):  # fmt: skip
    q = carray(pointer_f32(q_addr), (units // splits) * rows * dk)
    m = carray(pointer_f32(m_addr), units * rows)
    lsum = carray(pointer_f32(l_addr), units * rows)
    acc = carray(pointer_f32(acc_addr), units * rows * dv)
    bad = carray(pointer_i32(bad_addr), units)
    sc, lim = np.float32(scale), np.float32(limit)
    for u in range(first, units, step):
        _unit(q, k, v, ks, vs, m, lsum, acc, bad, u, splits, rows, n, dk, dv, chunk, sc, lim)


@njit(**KERNEL)
def partials_f32(
    q_addr, k_addr, v_addr, k_span, v_span, ks_n, ks_j, vs_n, vs_j,
    rows, n, dk, dv, chunk, splits, scale, limit,
    m_addr, l_addr, acc_addr, bad_addr, units, first, step,
):  # fmt: skip
    """Units ``first, first + step, ...`` below ``units``; K and V float32 (strides in
    elements: ``ks_n`` between row blocks, ``ks_j`` between keys; spans in elements)."""
    k, v = carray(pointer_f32(k_addr), k_span), carray(pointer_f32(v_addr), v_span)
    _units(q_addr, k, v, (ks_n, ks_j), (vs_n, vs_j), rows, n, dk, dv, chunk, splits, scale,
           limit, m_addr, l_addr, acc_addr, bad_addr, units, first, step)  # fmt: skip


@njit(**KERNEL)
def partials_bf16(
    q_addr, k_addr, v_addr, k_span, v_span, ks_n, ks_j, vs_n, vs_j,
    rows, n, dk, dv, chunk, splits, scale, limit,
    m_addr, l_addr, acc_addr, bad_addr, units, first, step,
):  # fmt: skip
    """:func:`partials_f32` with K and V bfloat16 (read as 16-bit words)."""
    k, v = carray(pointer_u16(k_addr), k_span), carray(pointer_u16(v_addr), v_span)
    _units(q_addr, k, v, (ks_n, ks_j), (vs_n, vs_j), rows, n, dk, dv, chunk, splits, scale,
           limit, m_addr, l_addr, acc_addr, bad_addr, units, first, step)  # fmt: skip


@njit(**KERNEL)
def combine(m_addr, l_addr, acc_addr, bad_addr, out_addr, blocks, splits, rows, dv):
    """Merge the splits of each row block into out (blocks, rows, dv) float32; 0 when no unit
    flagged its scores and every output entry is finite, else 1."""
    bad = carray(pointer_i32(bad_addr), blocks * splits)
    for u in range(blocks * splits):
        if bad[u]:
            return 1
    m = carray(pointer_f32(m_addr), blocks * splits * rows)
    lsum = carray(pointer_f32(l_addr), blocks * splits * rows)
    acc = carray(pointer_f32(acc_addr), blocks * splits * rows * dv)
    out = carray(pointer_f32(out_addr), blocks * rows * dv)
    w = np.empty(splits, np.float32)
    finite = 0
    for i in range(blocks):
        for r in range(rows):
            mx = m[(i * splits) * rows + r]
            for sp in range(1, splits):
                mx = max(mx, m[(i * splits + sp) * rows + r])
            tot = np.float32(0.0)
            for sp in range(splits):
                w[sp] = exp_nonpos_f32(m[(i * splits + sp) * rows + r] - mx)
                tot += w[sp] * lsum[(i * splits + sp) * rows + r]
            for sp in range(splits):
                w[sp] /= tot
            ob = (i * rows + r) * dv
            for x in range(dv):
                out[ob + x] = np.float32(0.0)
            for sp in range(splits):
                ab = ((i * splits + sp) * rows + r) * dv
                for x in range(dv):
                    out[ob + x] += w[sp] * acc[ab + x]
            for x in range(dv):
                finite += 1 if abs(out[ob + x]) < np.inf else 0
    return 0 if finite == blocks * rows * dv else 1
