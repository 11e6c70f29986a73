"""What the GPU bench rows (``bench_gpu_*.py``) share: the skip without CUDA, GPU timing with
CUDA events (interleaved, medians), host time per call, peak device memory, GPU inputs.

A GPU row returns :func:`skipped` (no times, nothing judged, the reason in its notes) when torch
sees no CUDA device, so the rows list and run on every machine and CI stays green.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

NEEDS_CUDA = "skipped: needs a CUDA GPU (torch.cuda.is_available() is False)"


def cuda_missing() -> str | None:
    """None when a CUDA device is usable, else the reason the GPU rows skip."""
    return None if torch.cuda.is_available() else NEEDS_CUDA


def skipped(why: str, peer: str) -> dict:
    """The result of a GPU row that did not run: no times, no judgement, the reason."""
    return dict(impl_s=None, peer_s=None, peer=peer, target_met=None, extra=dict(status=why))


def device_info() -> dict:
    """GPU name, torch and CUDA versions (for a row's notes and the gpu-check table)."""
    return dict(
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        torch=torch.__version__,
        cuda=torch.version.cuda or "none",
    )


def _interleaved(
    fns: dict[str, Callable[[], object]], warmup: int, reps: int, one: Callable
) -> dict[str, float]:
    """Median of ``one(fn)`` (seconds) per function, rounds alternating the order."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    torch.cuda.synchronize()
    ts: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(reps):
        for k in order if r % 2 == 0 else order[::-1]:
            ts[k].append(one(fns[k]))
    return {k: float(statistics.median(v)) for k, v in ts.items()}


def gpu_times(
    fns: dict[str, Callable[[], object]], warmup: int = 3, reps: int = 20
) -> dict[str, float]:
    """Median GPU time (seconds) of each function, measured alternately with CUDA events."""

    def one(fn: Callable[[], object]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return _interleaved(fns, warmup, reps, one)


def host_times(
    fns: dict[str, Callable[[], object]], calls: int = 200, reps: int = 7
) -> dict[str, float]:
    """Median host time per call (seconds): ``calls`` calls enqueued back to back, timed on the
    CPU clock up to the last launch (the GPU work of tiny calls hides behind the host's)."""

    def one(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        took = (time.perf_counter() - t0) / calls
        torch.cuda.synchronize()
        return took

    return _interleaved(fns, 10, reps, one)


def peak_mib(fn: Callable[[], object]) -> float:
    """Peak device memory of one run of ``fn`` above what was allocated before (MiB)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def randn(shape: tuple[int, ...], dtype: torch.dtype, grad: bool = False, seed: int = 0):
    """A seeded normal tensor on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    return t.requires_grad_(grad)
