"""numba kernels of element-wise dropout: a counter-based keep mask, applied in one pass.

Element ``i`` of a flat (contiguous) tensor survives when a 32-bit word of splitmix64 is at
least the threshold ``t`` (:func:`attnkit.kernels.dropout.elementwise.threshold`)::

    mix(z)  = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
              z ^ (z >> 31)                       (uint64, mod 2**64, logical shifts)
    u       = mix(seed + (i // 2 + 1) * 0x9E3779B97F4A7C15)
    word    = u & 0xFFFFFFFF when i is even, u >> 32 when i is odd
    keep[i] = word >= t

(splitmix64's own sequence, two words per output), so the mask is a pure function of (seed, i):
the same for any cut of the work into units and any number of threads.

Work units: ``chunk`` elements each (``chunk`` even, so a pair never straddles two units); a
launch runs units ``first, first + step, ...`` (:func:`attnkit.kernels.numba.runtime.launch`).

This module imports numba; attnkit loads it only through
:func:`attnkit.kernels.numba.runtime.load_kernels` (on-disk cache of compiled code).
"""

from __future__ import annotations

from numba import njit, types, uint64

__all__ = ["keep_scale", "masked_scale"]

KERNEL = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy")
_GOLDEN = uint64(0x9E3779B97F4A7C15)
_M1 = uint64(0xBF58476D1CE4E5B9)
_M2 = uint64(0x94D049BB133111EB)
_LOW = uint64(0xFFFFFFFF)


def _signatures(*tail: types.Type) -> list:
    """One signature per floating dtype: (x, out, *tail, first, step) with x and out of it."""
    out = []
    for f in (types.float32, types.float64):
        arr = types.Array(f, 1, "C")
        extra = [f if t is types.float32 else t for t in tail]
        out.append(types.void(arr, arr, *extra, types.int64, types.int64))
    return out


_BOOL = types.Array(types.boolean, 1, "C")


@njit(inline="always", **{k: v for k, v in KERNEL.items() if k != "cache"})
def _mix(z):
    z = (z ^ (z >> uint64(30))) * _M1
    z = (z ^ (z >> uint64(27))) * _M2
    return z ^ (z >> uint64(31))


@njit(inline="always", **{k: v for k, v in KERNEL.items() if k != "cache"})
def _span(u, chunk, n):
    """Elements lo:hi of work unit u."""
    lo = u * chunk
    return lo, min(n, lo + chunk)


@njit(_signatures(_BOOL, types.uint64, types.uint64, types.float32, types.int64), **KERNEL)
def keep_scale(x, out, keep, seed, thresh, scale, chunk, first, step):  # pragma: no cover
    """keep[i] as in the module docstring; out[i] = x[i] * (scale if keep[i] else 0) (a
    multiplication, as torch's: a NaN or inf that is dropped gives NaN)."""
    n = x.size
    zero = out.dtype.type(0)
    for u in range(first, (n + chunk - 1) // chunk, step):
        lo, hi = _span(u, chunk, n)
        # slices indexed from 0: LLVM vectorises these loops, not ones from lo to hi
        xs, os, ks = x[lo:hi], out[lo:hi], keep[lo:hi]
        base = seed + uint64(lo // 2 + 1) * _GOLDEN
        for k in range((hi - lo) // 2):
            z = _mix(base + uint64(k) * _GOLDEN)
            for w in range(2):
                kept = ((z >> uint64(32 * w)) & _LOW) >= thresh
                ks[2 * k + w] = kept
                os[2 * k + w] = xs[2 * k + w] * (scale if kept else zero)
        if (hi - lo) % 2:  # the last element of an odd-sized tensor: the low word of its pair
            z = _mix(seed + uint64(hi // 2 + 1) * _GOLDEN)
            kept = (z & _LOW) >= thresh
            keep[hi - 1] = kept
            out[hi - 1] = x[hi - 1] * (scale if kept else zero)


@njit(_signatures(_BOOL, types.float32, types.int64), **KERNEL)
def masked_scale(g, out, keep, scale, chunk, first, step):  # pragma: no cover
    """The backward of :func:`keep_scale`: out[i] = g[i] * (scale if keep[i] else 0)."""
    n = g.size
    zero = out.dtype.type(0)
    for u in range(first, (n + chunk - 1) // chunk, step):
        lo, hi = _span(u, chunk, n)
        gs, os, ks = g[lo:hi], out[lo:hi], keep[lo:hi]
        for i in range(hi - lo):
            os[i] = gs[i] * (scale if ks[i] else zero)
