"""Raw memory access for numba kernels: typed pointers from addresses, and float32 from bits.

Kernels that read a tensor in place take its data address as an integer (``tensor.data_ptr()``
plus an offset) and wrap it with ``numba.carray(pointer_f32(address), n)``: no copy, any slice
of a larger buffer. The caller keeps the tensor alive during the call and passes the right
element count; nothing here checks either.

- ``pointer_f32``, ``pointer_u16``, ``pointer_i16``, ``pointer_i32``, ``pointer_i64``: an
  integer address (``intp``) as a pointer to that element type.
- :func:`bits_to_f32`: the bits of an int32 reinterpreted as a float32 (a bit cast, no
  conversion), for building floats from exponent bits or widening bfloat16 words.

This module imports numba; kernel modules import it, and the rest of attnkit reaches them only
through :func:`attnkit.kernels.numba_runtime.load_kernels`. Kernel modules that use it list this
file among their kernel files, so a change here recompiles them.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = [
    "bits_to_f32",
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


@intrinsic
def bits_to_f32(typingctx, bits):
    """Reinterpret the bits of an int32 as a float32 (no conversion)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen
