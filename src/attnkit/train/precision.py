"""Whether this CPU computes bfloat16 natively, which ``--bf16`` autocast requires: the same
/proc/cpuinfo flags ``attnkit info`` reports as "native bf16" (x86 AVX512-BF16 or AMX-BF16,
Arm bf16). Elsewhere bf16 matmuls are emulated and slower than float32."""

from __future__ import annotations

from functools import cache
from pathlib import Path

__all__ = ["BF16_FLAGS", "native_bf16", "require_native_bf16"]

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


@cache
def native_bf16() -> bool:
    """True when /proc/cpuinfo lists a native-bf16 flag (False where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return any(f in value.split() for f in BF16_FLAGS)
    return False


def require_native_bf16() -> None:
    """ValueError naming ``bf16`` when this CPU has no native bf16."""
    if not native_bf16():
        raise ValueError(
            "bf16: this CPU has no native bfloat16 (no avx512_bf16, amx_bf16 or bf16 flag in "
            "/proc/cpuinfo; see 'attnkit info'), where bf16 autocast is slower than float32; "
            "train without --bf16"
        )
