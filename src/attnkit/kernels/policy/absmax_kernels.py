"""numba kernels of the input scan (:mod:`attnkit.kernels.policy.scan`): the largest magnitude bit
pattern of a dense block of floats, read as integers.

For IEEE floats of one width, clearing the sign bit leaves a non-negative integer whose order is
the order of the magnitudes: 0 < subnormals < normals < inf (all exponent bits set, mantissa 0)
< NaN (exponent bits set, mantissa not 0). So one integer max over ``bits & ~sign`` gives, in a
single exact pass, both max|x| (when below the inf pattern) and whether any entry is NaN or
+-inf (at or above it). Integer max has no NaN semantics or rounding to respect, so LLVM
vectorises the loop (``vpmaxsd``) without fast-math flags.

Each kernel takes a run layout that the caller has proved to hold exactly the tensor's distinct
entries (:func:`attnkit.kernels.policy.scan.row_span`): ``rows`` runs of ``width`` contiguous
elements, run ``r`` starting ``r * stride`` elements after ``address`` (one dense block: ``rows =
1``; the q, k or v slice of a packed in-projection's output: one run per token). The caller keeps
the tensor alive during the call.

This module imports numba; attnkit loads it only through
:func:`attnkit.kernels.numba.runtime.load_kernels` (on-disk cache of compiled code).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from attnkit.kernels.numba.memory import pointer_i16, pointer_i32, pointer_i64

__all__ = [
    "absmax3_bits16",
    "absmax3_bits32",
    "absmax3_bits64",
    "absmax_bits16",
    "absmax_bits32",
    "absmax_bits64",
]


@njit(cache=True, nogil=True)
def absmax_bits16(address: int, width: int, rows: int, stride: int) -> int:
    """max of (bits & 0x7FFF) over ``rows`` runs of ``width`` int16 words at ``address``, run
    ``r`` at element ``r * stride`` (float16/bfloat16)."""
    low = np.int16(0x7FFF)
    m = np.int16(0)
    for r in range(rows):  # one run at a time: indices from 0, so the loop vectorises
        a = carray(pointer_i16(address + r * stride * 2), width)
        for i in range(width):
            m = np.int16(max(m, np.int16(a[i] & low)))
    return m


@njit(cache=True, nogil=True)
def absmax_bits32(address: int, width: int, rows: int, stride: int) -> int:
    """:func:`absmax_bits16` for int32 words (float32): max of (bits & 0x7FFFFFFF)."""
    low = np.int32(0x7FFFFFFF)
    m = np.int32(0)
    for r in range(rows):  # one run at a time: indices from 0, so the loop vectorises
        a = carray(pointer_i32(address + r * stride * 4), width)
        for i in range(width):
            m = np.int32(max(m, np.int32(a[i] & low)))
    return m


@njit(cache=True, nogil=True)
def absmax_bits64(address: int, width: int, rows: int, stride: int) -> int:
    """:func:`absmax_bits16` for int64 words (float64): max of (bits & 0x7FFF...F)."""
    low = np.int64(0x7FFFFFFFFFFFFFFF)
    m = np.int64(0)
    for r in range(rows):  # one run at a time: indices from 0, so the loop vectorises
        a = carray(pointer_i64(address + r * stride * 8), width)
        for i in range(width):
            m = np.int64(max(m, np.int64(a[i] & low)))
    return m


@njit(cache=True, nogil=True)
def absmax3_bits16(a0, w0, r0, s0, a1, w1, r1, s1, a2, w2, r2, s2) -> tuple:
    """:func:`absmax_bits16` of three run layouts in one call."""
    return (
        absmax_bits16(a0, w0, r0, s0),
        absmax_bits16(a1, w1, r1, s1),
        absmax_bits16(a2, w2, r2, s2),
    )


@njit(cache=True, nogil=True)
def absmax3_bits32(a0, w0, r0, s0, a1, w1, r1, s1, a2, w2, r2, s2) -> tuple:
    """:func:`absmax_bits32` of three run layouts in one call."""
    return (
        absmax_bits32(a0, w0, r0, s0),
        absmax_bits32(a1, w1, r1, s1),
        absmax_bits32(a2, w2, r2, s2),
    )


@njit(cache=True, nogil=True)
def absmax3_bits64(a0, w0, r0, s0, a1, w1, r1, s1, a2, w2, r2, s2) -> tuple:
    """:func:`absmax_bits64` of three run layouts in one call."""
    return (
        absmax_bits64(a0, w0, r0, s0),
        absmax_bits64(a1, w1, r1, s1),
        absmax_bits64(a2, w2, r2, s2),
    )
