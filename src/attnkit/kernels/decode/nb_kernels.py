"""numba kernels of the decode step: flash-decoding's split-K in one pass over K and V.

Work unit ``u`` = (row block ``i``, key split ``sp``): the R query rows of one (batch, key/value
head) pair (its grouped query heads folded into the rows) against keys ``sp * chunk ..`` of the
split. A unit reads each of its K rows once for all R rows, computes the R scores of that key,
then reads each V row once::

    s[r, j] = scale * q[i, r] . k[i, j]        (float32 accumulation, K read once)
    m[r] = max_j s[r, j]; p = exp(s - m); l[r] = sum_j p
    acc[r] = sum_j p[r, j] v[i, j]             (V read once)

:func:`run_units` (a C callback) runs the units of a step described by one int64 block
(:data:`HEAD`, :data:`ARGS`); every thread given the block claims units from its counter, so
the same callback serves one thread, torch's OpenMP threads and a thread pool. :func:`combine`
then merges the splits of a row block: ``M = max m``, ``L = sum l e^(m - M)``,
``out = sum acc e^(m - M) / L``.

K and V are passed by address with their strides in elements (the last dim contiguous), so a
slice of a cache buffer is read in place; float32 or bfloat16 (16-bit words widened to float32
by a 16-bit shift of their bits, exactly). q is float32, contiguous.

The policy (:mod:`attnkit.kernels.policy.numerics`, P5/P6) is checked as the scores are made: a unit
counts the scores strictly inside ``(-limit, limit)`` (NaN is never inside) and flags itself
when any is not; :func:`combine` flags a non-finite output (a NaN or inf in V reaches it). The
caller redoes a flagged step the exact way. fastmath here leaves out "nnan"/"ninf", so those
checks are compiled as written.

This module imports numba; attnkit loads it only through
:func:`attnkit.kernels.numba.runtime.load_kernels` (on-disk cache of compiled code).
"""

from __future__ import annotations

import numpy as np
from numba import carray, cfunc, njit, types
from numba.extending import overload

from attnkit.kernels.numba.memory import (
    atomic_add_i64,
    bits_to_f32,
    bits_to_f64,
    pointer_f32,
    pointer_i32,
    pointer_i64,
    pointer_u16,
    prefetch,
)
from attnkit.kernels.numba.nbmath import exp_nonpos_f32

__all__ = ["ARGS", "HEAD", "combine", "run_units"]

FAST = {"contract", "reassoc", "arcp", "nsz", "afn"}
KERNEL = dict(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
INLINE = dict(fastmath=FAST, error_model="numpy", forceinline=True)


def _widen(x):
    """float32 of a stored element: itself, or a bfloat16's 16 bits shifted into float32's."""


@overload(_widen, inline="always")
def _widen_impl(x):
    if x == types.uint16:
        return lambda x: bits_to_f32(np.int32(x) << np.int32(16))
    return lambda x: x


@njit(**INLINE)
def _softmax_rows(s, rows, c, m, lsum, o, limit):
    """Each row r of the scores s (rows, c) replaced by exp(s - max) in place, its max and sum
    stored at m[o + r], lsum[o + r]; returns how many scores are strictly inside (-limit,
    limit) (NaN never is)."""
    inside = 0
    for r in range(rows):
        sr = s[r * c : (r + 1) * c]
        mx = sr[0]
        for jj in range(c):
            mx = max(mx, sr[jj])
            inside += 1 if abs(sr[jj]) < limit else 0
        tot = np.float32(0.0)
        for jj in range(c):
            p = exp_nonpos_f32(sr[jj] - mx)
            sr[jj] = p
            tot += p
        m[o + r] = mx
        lsum[o + r] = tot
    return inside


GROUP = 8
"""Keys scored together by :func:`_unit`: eight dot products share each load of q and keep
eight accumulators in flight; eight V rows are added to the output in one pass over it."""


AHEAD = 64
"""Keys ahead of the current group whose K (or V) rows :func:`_unit` prefetches."""


@njit(**INLINE)
def _score_key(q, kr, s, i, rows, c, jj, dk, scale):
    """s[r, jj] = scale * q[i, r] . kr for every row r of block i (one key, the tail of a
    unit's keys after its groups)."""
    for r in range(rows):
        qr = q[(i * rows + r) * dk : (i * rows + r + 1) * dk]
        t = np.float32(0.0)
        for x in range(dk):
            t += qr[x] * _widen(kr[x])
        s[r * c + jj] = t * scale


@njit(**INLINE)
def _add_value(a, s, vr, rows, c, jj, dv):
    """a[r] += p[r, jj] * vr for every row r (one V row, the tail after the groups)."""
    for r in range(rows):
        ar = a[r * dv : (r + 1) * dv]
        p = s[r * c + jj]
        for x in range(dv):
            ar[x] += p * _widen(vr[x])


@njit(**INLINE)
def _unit(q, k, v, ks, vs, m, lsum, acc, bad, u, splits, rows, n, dk, dv, chunk, scale, limit):
    """One work unit (module docstring); k, v float32 or bfloat16 bits (uint16). Keys go in
    groups of GROUP, then one at a time; where it is inlined with constant widths (64, 128,
    :func:`any_unit`) the loops over the width have a known trip count."""
    i, sp = u // splits, u % splits
    j0 = sp * chunk
    c = min(n, j0 + chunk) - j0
    s = np.empty(rows * c, np.float32)
    full = c - c % GROUP
    kbase = i * ks[0] + j0 * ks[1]
    kaddr, vaddr, item = k.ctypes.data, v.ctypes.data, k.itemsize
    for jj in range(0, full, GROUP):
        b = kbase + jj * ks[1]
        for e in range(GROUP):  # the rows AHEAD keys on: the memory stream stays busy
            prefetch(kaddr + (b + (AHEAD + e) * ks[1]) * item)
        k0, k1 = k[b : b + dk], k[b + ks[1] : b + ks[1] + dk]
        k2, k3 = k[b + 2 * ks[1] : b + 2 * ks[1] + dk], k[b + 3 * ks[1] : b + 3 * ks[1] + dk]
        k4, k5 = k[b + 4 * ks[1] : b + 4 * ks[1] + dk], k[b + 5 * ks[1] : b + 5 * ks[1] + dk]
        k6, k7 = k[b + 6 * ks[1] : b + 6 * ks[1] + dk], k[b + 7 * ks[1] : b + 7 * ks[1] + dk]
        for r in range(rows):
            qr = q[(i * rows + r) * dk : (i * rows + r + 1) * dk]
            t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = np.float32(0.0)
            for x in range(dk):
                qx = qr[x]
                t0 += qx * _widen(k0[x])
                t1 += qx * _widen(k1[x])
                t2 += qx * _widen(k2[x])
                t3 += qx * _widen(k3[x])
                t4 += qx * _widen(k4[x])
                t5 += qx * _widen(k5[x])
                t6 += qx * _widen(k6[x])
                t7 += qx * _widen(k7[x])
            e = r * c + jj
            s[e], s[e + 1], s[e + 2], s[e + 3] = t0 * scale, t1 * scale, t2 * scale, t3 * scale
            s[e + 4], s[e + 5], s[e + 6], s[e + 7] = t4 * scale, t5 * scale, t6 * scale, t7 * scale
    for jj in range(full, c):
        b = kbase + jj * ks[1]
        _score_key(q, k[b : b + dk], s, i, rows, c, jj, dk, scale)
    o = u * rows
    inside = _softmax_rows(s, rows, c, m, lsum, o, limit)
    a = np.zeros(rows * dv, np.float32)
    vbase = i * vs[0] + j0 * vs[1]
    for jj in range(0, full, GROUP):
        b = vbase + jj * vs[1]
        for e in range(GROUP):
            prefetch(vaddr + (b + (AHEAD + e) * vs[1]) * item)
        v0, v1 = v[b : b + dv], v[b + vs[1] : b + vs[1] + dv]
        v2, v3 = v[b + 2 * vs[1] : b + 2 * vs[1] + dv], v[b + 3 * vs[1] : b + 3 * vs[1] + dv]
        v4, v5 = v[b + 4 * vs[1] : b + 4 * vs[1] + dv], v[b + 5 * vs[1] : b + 5 * vs[1] + dv]
        v6, v7 = v[b + 6 * vs[1] : b + 6 * vs[1] + dv], v[b + 7 * vs[1] : b + 7 * vs[1] + dv]
        for r in range(rows):
            ar = a[r * dv : (r + 1) * dv]
            p = s[r * c + jj : r * c + jj + GROUP]
            p0, p1, p2, p3, p4, p5, p6, p7 = p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]
            for x in range(dv):
                ar[x] += (
                    p0 * _widen(v0[x])
                    + p1 * _widen(v1[x])
                    + p2 * _widen(v2[x])
                    + p3 * _widen(v3[x])
                ) + (
                    p4 * _widen(v4[x])
                    + p5 * _widen(v5[x])
                    + p6 * _widen(v6[x])
                    + p7 * _widen(v7[x])
                )
    for jj in range(full, c):
        b = vbase + jj * vs[1]
        _add_value(a, s, v[b : b + dv], rows, c, jj, dv)
    for y in range(rows * dv):
        acc[o * dv + y] = a[y]
    bad[u] = 0 if inside == rows * c else 1


@njit(**INLINE)
def any_unit(q, k, v, ks, vs, m, lsum, acc, bad, u, splits, rows, n, dk, dv, chunk, scale, limit):
    """One work unit: :func:`_unit` inlined with constant widths for the common ones (64, 128),
    so their loops have a known trip count; with the call's widths otherwise."""
    if dk == 64 and dv == 64:
        _unit(q, k, v, ks, vs, m, lsum, acc, bad, u, splits, rows, n, 64, 64, chunk, scale, limit)
    elif dk == 128 and dv == 128:
        _unit(q, k, v, ks, vs, m, lsum, acc, bad, u, splits, rows, n, 128, 128, chunk, scale, limit)
    else:
        _unit(q, k, v, ks, vs, m, lsum, acc, bad, u, splits, rows, n, dk, dv, chunk, scale, limit)


HEAD = 4
"""Words of a step's block before its arguments: next unit, units, scale and limit (float64
bits)."""

ARGS = (
    "bf16", "q", "k", "v", "k_span", "v_span", "ks_n", "ks_j", "vs_n", "vs_j",
    "rows", "n", "dk", "dv", "chunk", "splits", "m", "l", "acc", "bad",
)  # fmt: skip
"""The step's int64 arguments after the head, in order (addresses; strides and spans in
elements: ``ks_n`` between row blocks, ``ks_j`` between keys; ``bf16`` is 1 for bfloat16 K and
V)."""


@cfunc(types.void(types.intp), cache=True, fastmath=FAST, error_model="numpy")
def run_units(block):
    """Claim units of the step in ``block`` one at a time (an atomic add on its first word) and
    run them, until none is left. Every thread running a step calls it with the same block: the
    caller alone, torch's OpenMP threads, or a thread pool's."""
    ia = carray(pointer_i64(block), HEAD + len(ARGS))
    units = ia[1]
    sc, lim = np.float32(bits_to_f64(ia[2])), np.float32(bits_to_f64(ia[3]))
    a = ia[HEAD:]
    rows, n, dk, dv, chunk, splits = a[10], a[11], a[12], a[13], a[14], a[15]
    q = carray(pointer_f32(a[1]), (units // splits) * rows * dk)
    m = carray(pointer_f32(a[16]), units * rows)
    lsum = carray(pointer_f32(a[17]), units * rows)
    acc = carray(pointer_f32(a[18]), units * rows * dv)
    bad = carray(pointer_i32(a[19]), units)
    ks, vs = (a[6], a[7]), (a[8], a[9])
    while True:
        u = atomic_add_i64(block, 1)
        if u >= units:
            return
        if a[0]:
            k, v = carray(pointer_u16(a[2]), a[4]), carray(pointer_u16(a[3]), a[5])
            any_unit(q, k, v, ks, vs, m, lsum, acc, bad, u, splits, rows, n, dk, dv, chunk, sc, lim)
        else:
            k32, v32 = carray(pointer_f32(a[2]), a[4]), carray(pointer_f32(a[3]), a[5])
            any_unit(
                q, k32, v32, ks, vs, m, lsum, acc, bad, u, splits, rows, n, dk, dv, chunk, sc, lim
            )


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
