"""numba kernels of the input scan (:mod:`attnkit.kernels.scan`): the largest magnitude bit
pattern of a dense block of floats, read as integers.

For IEEE floats of one width, clearing the sign bit leaves a non-negative integer whose order is
the order of the magnitudes: 0 < subnormals < normals < inf (all exponent bits set, mantissa 0)
< NaN (exponent bits set, mantissa not 0). So one integer max over ``bits & ~sign`` gives, in a
single exact pass, both max|x| (when below the inf pattern) and whether any entry is NaN or
+-inf (at or above it). Integer max has no NaN semantics or rounding to respect, so LLVM
vectorises the loop (``vpmaxsd``) without fast-math flags.

Each kernel takes the address of the first element and the element count of a block that the
caller has proved to be exactly the tensor's distinct entries (contiguous in storage order, see
:func:`attnkit.kernels.scan.dense_span`); the caller keeps the tensor alive during the call.

This module imports numba; attnkit loads it only through
:func:`attnkit.kernels.numba_runtime.load_kernels` (on-disk cache of compiled code).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from attnkit.kernels.nb_memory import pointer_i16, pointer_i32, pointer_i64

__all__ = [
    "absmax3_bits16",
    "absmax3_bits32",
    "absmax3_bits64",
    "absmax_bits16",
    "absmax_bits32",
    "absmax_bits64",
]


@njit(cache=True, nogil=True)
def absmax_bits16(address: int, n: int) -> int:
    """max over i < n of (bits_i & 0x7FFF) for n int16 words at ``address`` (float16/bfloat16)."""
    a = carray(pointer_i16(address), n)
    low = np.int16(0x7FFF)
    m = np.int16(0)
    for i in range(n):
        m = np.int16(max(m, np.int16(a[i] & low)))
    return m


@njit(cache=True, nogil=True)
def absmax_bits32(address: int, n: int) -> int:
    """max over i < n of (bits_i & 0x7FFFFFFF) for n int32 words at ``address`` (float32)."""
    a = carray(pointer_i32(address), n)
    low = np.int32(0x7FFFFFFF)
    m = np.int32(0)
    for i in range(n):
        m = np.int32(max(m, np.int32(a[i] & low)))
    return m


@njit(cache=True, nogil=True)
def absmax_bits64(address: int, n: int) -> int:
    """max over i < n of (bits_i & 0x7FFF...F) for n int64 words at ``address`` (float64)."""
    a = carray(pointer_i64(address), n)
    low = np.int64(0x7FFFFFFFFFFFFFFF)
    m = np.int64(0)
    for i in range(n):
        m = np.int64(max(m, np.int64(a[i] & low)))
    return m


@njit(cache=True, nogil=True)
def absmax3_bits16(a0: int, n0: int, a1: int, n1: int, a2: int, n2: int) -> tuple:
    """:func:`absmax_bits16` of three blocks in one call."""
    return absmax_bits16(a0, n0), absmax_bits16(a1, n1), absmax_bits16(a2, n2)


@njit(cache=True, nogil=True)
def absmax3_bits32(a0: int, n0: int, a1: int, n1: int, a2: int, n2: int) -> tuple:
    """:func:`absmax_bits32` of three blocks in one call."""
    return absmax_bits32(a0, n0), absmax_bits32(a1, n1), absmax_bits32(a2, n2)


@njit(cache=True, nogil=True)
def absmax3_bits64(a0: int, n0: int, a1: int, n1: int, a2: int, n2: int) -> tuple:
    """:func:`absmax_bits64` of three blocks in one call."""
    return absmax_bits64(a0, n0), absmax_bits64(a1, n1), absmax_bits64(a2, n2)
