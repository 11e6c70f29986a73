"""numba side of a decode step on torch's OpenMP threads: the body every thread of the parallel
region runs (:func:`body`, a C callback), claiming work units one at a time.

:func:`attnkit.kernels.openmp.parallel` runs ``body(block)`` on torch's OpenMP threads (the
caller is one of them); each thread takes the next unclaimed unit from the block's counter by an
atomic add, runs it (:func:`attnkit.kernels.decode.nb_kernels.any_unit`), and returns when none
is left. The region ends when every thread has returned, so every unit is done.

The block is int64 words (one per call, so calls from several Python threads never share one):
``[next, units, scale, limit, *ARGS]``, ``scale`` and ``limit`` holding float64 bits.

This module imports numba; attnkit loads it only through
:func:`attnkit.kernels.numba_runtime.load_kernels`.
"""

from __future__ import annotations

import numpy as np
from numba import carray, cfunc, types

from attnkit.kernels.decode.nb_kernels import FAST, any_unit
from attnkit.kernels.nb_memory import (
    atomic_add_i64,
    bits_to_f64,
    pointer_f32,
    pointer_i32,
    pointer_i64,
    pointer_u16,
)

__all__ = ["ARGS", "HEAD", "body"]

HEAD = 4
"""Words before the arguments: next unit, units, scale and limit (float64 bits)."""

ARGS = (
    "bf16", "q", "k", "v", "k_span", "v_span", "ks_n", "ks_j", "vs_n", "vs_j",
    "rows", "n", "dk", "dv", "chunk", "splits", "m", "l", "acc", "bad",
)  # fmt: skip
"""The step's int64 arguments after the head, in order (addresses; strides and spans in
elements; ``bf16`` is 1 for bfloat16 K and V)."""


@cfunc(types.void(types.intp), cache=True, fastmath=FAST, error_model="numpy")
def body(block):
    """Claim and run units of the step in ``block`` until none is left."""
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
