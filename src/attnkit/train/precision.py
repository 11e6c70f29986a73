"""Whether this CPU computes bfloat16 natively, which ``--bf16`` autocast requires: the same
/proc/cpuinfo flags ``attnkit info`` reports as "native bf16" (x86 AVX512-BF16 or AMX-BF16,
Arm bf16). Elsewhere bf16 matmuls are emulated and slower than float32."""

from __future__ import annotations

from attnkit.cpu import native_bf16

__all__ = ["require_native_bf16"]


def require_native_bf16() -> None:
    """ValueError naming ``bf16`` when this CPU has no native bf16 (:func:`attnkit.cpu.native_bf16`;
    unknown counts as no)."""
    if not native_bf16():
        raise ValueError(
            "bf16: this CPU has no native bfloat16 (no avx512_bf16, amx_bf16 or bf16 flag in "
            "/proc/cpuinfo; see 'attnkit info'), where bf16 autocast is slower than float32; "
            "train without --bf16"
        )
