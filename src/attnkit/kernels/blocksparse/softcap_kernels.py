"""The numba kernels of the fused softcap path (plain ``@njit``; all arithmetic float32).

Loaded through :func:`attnkit.kernels.numba.runtime.load_kernels` (see
:mod:`~attnkit.kernels.blocksparse.softcap`). The matrix products stay with torch (BLAS); these
kernels fuse everything between them into one pass over each row of a tile of scores:

- :func:`softmax_units`: s = q'·k (q' = q · scale / c) becomes the capped, masked, normalised
  probabilities P = softmax(c · tanh(s)) over the row's allowed keys a[r] <= j < b[r] (0
  elsewhere), and the row's log-sum-exp.
- :func:`grad_units`: from the recomputed s and dP = dO · vᵀ, P = exp(c · tanh(s) - lse) and the
  gradient of the pre-cap score, dS = P (dP - rowsum(dO * O)) (1 - tanh²), both in place
  (1 - tanh² from e^(-2|x|), exact where tanh saturates).

Rows without an allowed key get P = 0 and log-sum-exp -inf.

Shape legend: ``B`` batch-heads, ``n`` rows of a tile, ``m`` its keys.
"""

import numpy as np
from numba import njit

from attnkit.kernels.numba.nbmath import exp_nonpos_f32, tanh_f32

KERNEL = dict(cache=True, fastmath=True, error_model="numpy", nogil=True)
"""Options of the entry points."""
INLINE = dict(fastmath=True, error_model="numpy", forceinline=True)
"""Options of the helpers, inlined into the entry points."""

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_TWO = np.float32(2.0)
_FOUR = np.float32(4.0)
_SMALL = np.float32(0.55)
_SECH_ZERO = np.float32(43.5)
"""|x| from which 1 - tanh²(x) = 4e / (1 + e)², e = e^(-2|x|), is taken as 0 (below 6.6e-38;
exp_nonpos_f32 clamps at -87). Computed this way, not as 1 - t², which loses all but a few
bits where tanh saturates (|x| = 5: relative error ~3e-3 in float32)."""
MAX_START = np.float32(-np.finfo(np.float32).max / 4)
"""Running max before a row has seen a key: below every capped score (|s| <= c)."""


@njit(**INLINE)
def _tanh_e(x):
    """(tanh(x), e = e^(-2|x|)) for float32 x: (1 - e) / (1 + e) with x's sign from |x| = 0.55
    on (absolute error ~1e-7, exact where tanh saturates), Eigen's rational form below."""
    ax = abs(x)
    e = exp_nonpos_f32(-_TWO * ax)
    big = (_ONE - e) / (_ONE + e)
    return (tanh_f32(x) if ax < _SMALL else np.copysign(big, x)), e


@njit(**KERNEL)
def softmax_units(s, a, b, cap, lse, first, step):
    """Rows ``first, first + step, ...`` of s (B, n, m), row u = (u // n, u % n), in place:
    P over keys a[r] <= j < b[r]; lse (B, n) gets each row's log-sum-exp."""
    nb, n, m = s.shape
    for u in range(first, nb * n, step):
        x, r = u // n, u % n
        row, lo, hi = s[x, r], a[r], b[r]
        for j in range(0, lo):
            row[j] = _ZERO
        for j in range(hi, m):
            row[j] = _ZERO
        if lo >= hi:
            lse[x, r] = -np.inf
            continue
        seg, w = row[lo:hi], hi - lo  # loops from 0 over a slice vectorise (3x)
        for j in range(w):  # one loop per step: a reduction in a loop stops its SIMD
            seg[j] = cap * _tanh_e(seg[j])[0]
        mx = MAX_START
        for j in range(w):
            mx = np.maximum(mx, seg[j])  # not max(): its NaN rule is not vectorised
        for j in range(w):
            seg[j] = exp_nonpos_f32(seg[j] - mx)
        tot = _ZERO
        for j in range(w):
            tot += seg[j]
        inv = _ONE / tot
        for j in range(w):
            seg[j] *= inv
        lse[x, r] = mx + np.log(tot)


@njit(**KERNEL)
def grad_units(s, dp, a, b, cap, lse, dd, first, step):
    """Rows ``first, first + step, ...`` of s and dp (B, n, m), in place: s <- P =
    exp(c tanh(s) - lse), dp <- (dp - dd) P (1 - tanh²) over keys a[r] <= j < b[r] (0
    elsewhere); lse, dd (B, n) (dd = rowsum(dO * O))."""
    nb, n, m = s.shape
    for u in range(first, nb * n, step):
        x, r = u // n, u % n
        row, g, lo, hi = s[x, r], dp[x, r], a[r], b[r]
        if lo >= hi or lse[x, r] == -np.inf:
            lo, hi = 0, 0
        for j in range(0, lo):
            row[j] = _ZERO
            g[j] = _ZERO
        for j in range(hi, m):
            row[j] = _ZERO
            g[j] = _ZERO
        ls, d = lse[x, r], dd[x, r]
        seg, gs = row[lo:hi], g[lo:hi]
        for j in range(hi - lo):
            x = seg[j]
            t, e = _tanh_e(x)
            sech2 = _FOUR * e / ((_ONE + e) * (_ONE + e))
            p = exp_nonpos_f32(cap * t - ls)
            seg[j] = p
            gs[j] = p * (gs[j] - d) * (sech2 if abs(x) < _SECH_ZERO else _ZERO)
