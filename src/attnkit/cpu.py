"""What /proc/cpuinfo says about this CPU: its fields and whether it computes bfloat16 natively.

Torch-free, read once per process. ``attnkit info`` shows these facts, ``--bf16`` training
requires native bf16, and the benchmarks record them beside every table: one reader serves all.
Native bf16 means x86 AVX512-BF16 or AMX-BF16, or Arm's bf16; elsewhere bf16 matmuls are
emulated and slower than float32.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

__all__ = ["BF16_FLAGS", "cpu_flags", "cpuinfo", "native_bf16", "parse_cpuinfo"]

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""/proc/cpuinfo flags of native bfloat16 arithmetic (x86 AVX512-BF16, AMX-BF16; Arm bf16)."""


@cache
def cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return parse_cpuinfo(text)


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The fields of the first processor block of a /proc/cpuinfo ``text`` (key: value lines,
    blocks separated by a blank line)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(fields: dict[str, str] | None = None) -> frozenset[str]:
    """The feature flags (x86 ``flags``, Arm ``Features``) of ``fields`` (default: this CPU's
    :func:`cpuinfo`); empty where unknown."""
    fields = cpuinfo() if fields is None else fields
    return frozenset((fields.get("flags") or fields.get("Features") or "").split())


def native_bf16(flags: frozenset[str] | None = None) -> bool | None:
    """True when ``flags`` (default: this CPU's) hold a native-bf16 flag, False when there are
    flags but none of them, None where no flags are known (not Linux)."""
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in BF16_FLAGS) if flags else None
