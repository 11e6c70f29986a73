"""Raw memory access for numba kernels: typed pointers from addresses, and float32 from bits.

Kernels that read a tensor in place take its data address as an integer (``tensor.data_ptr()``
plus an offset) and wrap it with ``numba.carray(pointer_f32(address), n)``: no copy, any slice
of a larger buffer. The caller keeps the tensor alive during the call and passes the right
element count; nothing here checks either.

- ``pointer_f32``, ``pointer_u16``, ``pointer_i16``, ``pointer_i32``, ``pointer_i64``: an
  integer address (``intp``) as a pointer to that element type.
- :func:`bits_to_f32`: the bits of an int32 reinterpreted as a float32 (a bit cast, no
  conversion), for building floats from exponent bits or widening bfloat16 words.
- :func:`bits_to_f64`: the bits of an int64 reinterpreted as a float64.
- :func:`prefetch`: ask for the cache line at an address ahead of its use (a hint; no fault).
- :func:`atomic_add_i64`: add to the int64 at an address atomically (sequentially consistent),
  for threads that claim work units from a shared counter
  (:mod:`attnkit.kernels.decode.nb_kernels`).

This module imports numba; kernel modules import it, and the rest of attnkit reaches them only
through :func:`attnkit.kernels.numba.runtime.load_kernels`. Kernel modules that use it list this
file among their kernel files, so a change here recompiles them.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "atomic_add_i64",
    "bits_to_f32",
    "bits_to_f64",
    "prefetch",
    "pointer_f32",
    "pointer_i16",
    "pointer_i32",
    "pointer_i64",
    "pointer_u16",
]


def _pointer_intrinsic(kind: types.Type):
    """An intrinsic turning an integer address into a ``kind *``."""

    def typer(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(types.CPointer(kind)))

        return types.CPointer(kind)(types.intp), codegen

    return intrinsic(typer)


pointer_f32 = _pointer_intrinsic(types.float32)
pointer_u16 = _pointer_intrinsic(types.uint16)
pointer_i16 = _pointer_intrinsic(types.int16)
pointer_i32 = _pointer_intrinsic(types.int32)
pointer_i64 = _pointer_intrinsic(types.int64)


def _bitcast_intrinsic(src: types.Type, dst: types.Type, ir_type: ir.Type):
    """An intrinsic reinterpreting the bits of a ``src`` integer as a ``dst`` float."""

    def typer(typingctx, bits):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir_type)

        return dst(src), codegen

    return intrinsic(typer)


bits_to_f32 = _bitcast_intrinsic(types.int32, types.float32, ir.FloatType())
"""Reinterpret the bits of an int32 as a float32 (no conversion)."""
bits_to_f64 = _bitcast_intrinsic(types.int64, types.float64, ir.DoubleType())
"""Reinterpret the bits of an int64 as a float64 (no conversion)."""


@intrinsic
def atomic_add_i64(typingctx, address, value):
    """Add ``value`` to the int64 at ``address`` atomically; returns the value before."""

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int64)))
        return builder.atomic_rmw("add", ptr, args[1], "seq_cst")

    return types.int64(types.intp, types.int64), codegen


@intrinsic
def prefetch(typingctx, address):
    """Hint that the cache line at ``address`` is read soon (``llvm.prefetch``: read, keep in
    all cache levels); never faults, does nothing where the CPU has no prefetch."""

    def codegen(context, builder, signature, args):
        ptr_t = ir.PointerType()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr_t, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        ptr = builder.inttoptr(args[0], ptr_t)
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.none(types.intp), codegen
