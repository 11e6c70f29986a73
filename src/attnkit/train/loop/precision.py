"""Whether the run's device computes bfloat16 natively, which ``--bf16`` autocast requires.

On the CPU: the same /proc/cpuinfo flags ``attnkit info`` reports as "native bf16" (x86
AVX512-BF16 or AMX-BF16, Arm bf16); elsewhere bf16 matmuls are emulated and slower than float32.
On CUDA: ``torch.cuda.is_bf16_supported()`` (Ampere and newer)."""

from __future__ import annotations

import contextlib

import torch

from attnkit.cpu import native_bf16

__all__ = ["autocast", "grad_scaler", "require_bf16", "require_fp16", "require_native_bf16"]


def require_native_bf16() -> None:
    """ValueError naming ``bf16`` when this CPU has no native bf16 (:func:`attnkit.cpu.native_bf16`;
    unknown counts as no)."""
    if not native_bf16():
        raise ValueError(
            "bf16: this CPU has no native bfloat16 (no avx512_bf16, amx_bf16 or bf16 flag in "
            "/proc/cpuinfo; see 'attnkit info'), where bf16 autocast is slower than float32; "
            "train without --bf16"
        )


def require_bf16(device: torch.device) -> None:
    """ValueError naming ``bf16`` when ``device`` has no native bfloat16: the CPU's flags
    (:func:`require_native_bf16`), a GPU without bf16 (before Ampere), or another device."""
    if device.type == "cpu":
        require_native_bf16()
    elif device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            name = torch.cuda.get_device_name(device)
            raise ValueError(
                f"bf16: this GPU ({name}) has no native bfloat16 (it needs compute capability "
                "8.0 or newer: A100, RTX 30xx, H100 and later); train without --bf16"
            )
    else:
        raise ValueError(f"bf16: autocast is supported on cpu and cuda, not on {device.type}")


def require_fp16(device: torch.device) -> None:
    """ValueError naming ``fp16`` unless ``device`` is a GPU (float16 with gradient scaling is
    for GPUs without bf16; on a CPU, float16 matmuls are slower than float32)."""
    if device.type != "cuda":
        raise ValueError(
            f"fp16: float16 autocast with gradient scaling runs on a CUDA GPU, not on "
            f"{device.type}; on a CPU use --bf16 (native bf16 CPUs) or neither"
        )


def autocast(
    device: torch.device, bf16: bool, fp16: bool = False
) -> contextlib.AbstractContextManager:
    """bfloat16 (``bf16``) or float16 (``fp16``) autocast on ``device``'s type, else nothing."""
    if not (bf16 or fp16):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if bf16 else torch.float16)


def grad_scaler(device: torch.device, fp16: bool) -> torch.amp.GradScaler | None:
    """The gradient scaler of an ``fp16`` run on ``device`` (None otherwise): float16 gradients
    underflow without it."""
    return torch.amp.GradScaler(device.type) if fp16 else None
