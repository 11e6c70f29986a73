"""Additive attention: attnkit's fused kernel against plain PyTorch, side by side.

e_ij = w_v . tanh(W_q q_i + W_k k_j); softmax over j; output = sum_j alpha_ij v_j.
Sizes as in issue 5: B = 1, H = 8, d = 64, hidden width h = 64, float32.

Rows:
- ``additive-fwd-2k``: forward at L = 2048 against the tutorial implementation, which builds the
  (B, H, Lq, Lk, h) tanh tensor (about 17 GB here). Target: >= 20x faster and >= 30x less peak
  memory. The notes also give the kernels' compile time (cold, fresh cache directory), the first
  forward + backward of a new process that loads them from numba's disk cache, and the forward
  on one thread.
- ``additive-chunked-2k``: the same forward against chunked PyTorch (query chunks, at most
  2^25 tanh entries at once).
- ``additive-fwdbwd-4k``: forward + backward at L = 4096 against chunked PyTorch with activation
  checkpointing per chunk (the tutorial implementation would need 69 GB). Target: peak memory
  within 1 GB above the inputs.

Peak memory of each side is measured in the row's process with ``common.peak_memory_mib`` (peak
RSS above the RSS just before the call, after resetting the kernel's high-water mark), after
``malloc_trim(0)`` has handed memory freed by earlier calls back to the OS (otherwise a call that
reuses freed heap pages would show no growth at all). The
tutorial implementation runs only when /proc/meminfo says that enough memory is free; otherwise
it runs with fewer heads and its time and memory are scaled up to H = 8 (marked "extrapolated").

    python benchmarks/bench_additive.py --list
    python benchmarks/bench_additive.py --row additive-fwd-2k [--quick]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch
from common import (
    chosen_backend,
    interleaved_medians,
    main,
    mem_available_bytes,
    rel_err,
    row,
    trimmed_peak_memory_mib,
)
from torch.utils.checkpoint import checkpoint

import attnkit

B, H, D, HID = 1, 8, 64, 64
CHUNK_ELEMENTS = 2**25
"""Most tanh entries the chunked PyTorch peer builds at once (128 MiB in float32)."""
GIB = 1024**3


def _inputs(length: int, heads: int = H, grad: bool = False) -> list[torch.Tensor]:
    """q, k, v (B, heads, L, D), w_q, w_k (HID, D), w_v (HID,), float32."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(B, heads, length, D, generator=g) for _ in range(3)]
    xs += [torch.randn(HID, D, generator=g) * D**-0.5 for _ in range(2)]
    xs.append(torch.randn(HID, generator=g) * 2 * HID**-0.5)
    return [x.requires_grad_(grad) for x in xs]


def tutorial(q, k, v, w_q, w_k, w_v):
    """Additive attention as tutorials write it: the whole (B, H, Lq, Lk, h) tanh tensor."""
    qp, kp = q @ w_q.T, k @ w_k.T
    scores = torch.tanh(qp.unsqueeze(-2) + kp.unsqueeze(-3)) @ w_v  # (B, H, Lq, Lk)
    return torch.softmax(scores, dim=-1) @ v


def _chunk(qp_rows, kp, v, w_v):
    scores = torch.tanh(qp_rows.unsqueeze(-2) + kp.unsqueeze(-3)) @ w_v
    return torch.softmax(scores, dim=-1) @ v


def chunked(q, k, v, w_q, w_k, w_v, recompute: bool = False):
    """Additive attention in query chunks (at most CHUNK_ELEMENTS tanh entries at once); with
    ``recompute`` each chunk is checkpointed, so backward rebuilds its tanh instead of storing
    it."""
    qp, kp = q @ w_q.T, k @ w_k.T
    rows = max(1, CHUNK_ELEMENTS // (qp.shape[:-2].numel() * kp.shape[-2] * kp.shape[-1]))
    parts = []
    for s in range(0, qp.shape[-2], rows):
        if recompute:
            parts.append(
                checkpoint(_chunk, qp[..., s : s + rows, :], kp, v, w_v, use_reentrant=False)
            )
        else:
            parts.append(_chunk(qp[..., s : s + rows, :], kp, v, w_v))
    return torch.cat(parts, dim=-2)


def ours(q, k, v, w_q, w_k, w_v):
    return attnkit.additive_attention(q, k, v, w_q, w_k, w_v)


def _backend(xs) -> str:
    q, k, v, w_q, w_k, w_v = xs
    return chosen_backend(q, k, v, kind="additive", w_q=w_q, w_k=w_k, w_v=w_v)


_FIRST_CALL = """
import time, torch, attnkit
xs = [torch.randn(s).requires_grad_() for s in ((1, 64, 8), (1, 64, 8), (1, 64, 8), (4, 8),
      (4, 8), (4,))]
t = time.perf_counter()
attnkit.additive_attention(*xs).sum().backward()
print(time.perf_counter() - t)
"""
"""A new process's first forward + backward (numba import + kernels loaded from the cache)."""


def _compile_times() -> dict:
    """Cold compile time of the kernels (fresh numba cache directory, in this process: first
    forward, first backward, numba's import included) and the first forward + backward of a new
    process that finds them in that cache."""
    from attnkit.kernels import additive as additive_fused

    with tempfile.TemporaryDirectory() as cache:
        os.environ["NUMBA_CACHE_DIR"] = cache
        try:
            xs = _inputs(64, heads=1, grad=True)
            t0 = time.perf_counter()
            additive_fused.load_kernels()
            out = ours(*xs)
            t1 = time.perf_counter()
            out.sum().backward()
            t2 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True)
            load = float(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
        finally:
            del os.environ["NUMBA_CACHE_DIR"]
    return dict(
        compile_fwd_s=round(t1 - t0, 2),
        compile_bwd_s=round(t2 - t1, 2),
        cached_first_call_s=None if load is None else round(load, 2),
    )


@row("additive-fwd-2k", "additive", "L=2048 fwd vs tutorial", ">=20x, >=30x less memory")
def additive_fwd_2k(quick: bool) -> dict:
    length, reps = (256, 3) if quick else (2048, 3)
    extra = {} if quick else _compile_times()
    xs = _inputs(length)
    tutorial_bytes = 2 * B * H * length * length * HID * 4  # the sum and its tanh
    heads = H
    while heads > 1 and mem_available_bytes() < tutorial_bytes * heads // H + 2 * GIB:
        heads //= 2
    peer_xs = xs if heads == H else _inputs(length, heads)
    scale = H / heads
    with torch.inference_mode():
        ours(*xs)  # compile / load the kernel before anything is timed
        err = rel_err(ours(*peer_xs), tutorial(*peer_xs))
        t = interleaved_medians(
            {"impl": lambda: ours(*xs), "peer": lambda: tutorial(*peer_xs)}, warmup=0, reps=reps
        )
        mem_ours = trimmed_peak_memory_mib(lambda: ours(*xs))
        mem_peer = trimmed_peak_memory_mib(lambda: tutorial(*peer_xs)) * scale
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            one_thread = interleaved_medians({"impl": lambda: ours(*xs)}, warmup=1, reps=reps)
        finally:
            torch.set_num_threads(threads)
    peer_s = t["peer"] * scale
    ratio, mem_ratio = peer_s / t["impl"], mem_peer / max(mem_ours, 1e-3)
    extra.update(
        backend=_backend(xs),
        rel_err=err,
        mem_ours_mib=round(mem_ours, 1),
        mem_tutorial_mib=round(mem_peer, 1),
        mem_ratio=round(mem_ratio, 1),
        impl_1thread_s=round(one_thread["impl"], 4),
        reps=reps,
    )
    if heads != H:
        extra["tutorial"] = f"extrapolated from H={heads} (not enough free memory for H={H})"
    return dict(
        case=f"L={length} fwd, B={B} H={H} d={D} h={HID}",
        impl_s=t["impl"],
        peer_s=peer_s,
        peer="tutorial (B*H*L*L*h tanh)",
        target_met=bool(ratio >= 20 and mem_ratio >= 30),
        extra=extra,
    )


@row("additive-chunked-2k", "additive", "L=2048 fwd vs chunked torch")
def additive_chunked_2k(quick: bool) -> dict:
    length, reps = (256, 3) if quick else (2048, 5)
    xs = _inputs(length)
    with torch.inference_mode():
        ours(*xs)
        err = rel_err(ours(*xs), chunked(*xs))
        t = interleaved_medians(
            {"impl": lambda: ours(*xs), "peer": lambda: chunked(*xs)}, warmup=1, reps=reps
        )
        mem_ours = trimmed_peak_memory_mib(lambda: ours(*xs))
        mem_peer = trimmed_peak_memory_mib(lambda: chunked(*xs))
    return dict(
        case=f"L={length} fwd, B={B} H={H} d={D} h={HID}",
        impl_s=t["impl"],
        peer_s=t["peer"],
        peer="chunked torch (query chunks)",
        extra=dict(
            backend=_backend(xs),
            rel_err=err,
            mem_ours_mib=round(mem_ours, 1),
            mem_peer_mib=round(mem_peer, 1),
            reps=reps,
        ),
    )


@row("additive-fwdbwd-4k", "additive", "L=4096 fwd+bwd", "<=1 GB above inputs")
def additive_fwdbwd_4k(quick: bool) -> dict:
    length, reps = (256, 3) if quick else (4096, 2)  # the peer takes minutes per run at 4096
    xs = _inputs(length, grad=True)
    g = torch.randn(B, H, length, D, generator=torch.Generator().manual_seed(1))

    def fwd_bwd(fn):
        def run():
            return torch.autograd.grad(fn(*xs), xs, g)

        return run

    run_ours = fwd_bwd(ours)
    run_peer = fwd_bwd(lambda *a: chunked(*a, recompute=True))
    run_ours()  # compile / load the kernels
    got: dict = {}  # the memory runs also give the gradients to compare
    mem_ours = trimmed_peak_memory_mib(lambda: got.update(ours=run_ours()))
    mem_peer = trimmed_peak_memory_mib(lambda: got.update(peer=run_peer()))
    err = max(float(e) for e in map(rel_err, got["ours"], got["peer"]))
    got.clear()
    t = interleaved_medians({"impl": run_ours, "peer": run_peer}, warmup=0, reps=reps)
    return dict(
        case=f"L={length} fwd+bwd, B={B} H={H} d={D} h={HID}",
        impl_s=t["impl"],
        peer_s=t["peer"],
        peer="chunked torch + checkpointing",
        target_met=bool(mem_ours <= 1024),
        extra=dict(
            backend=_backend(xs),
            grad_rel_err=f"{err:.1e}",
            mem_ours_mib=round(mem_ours, 1),
            mem_peer_mib=round(mem_peer, 1),
            reps=reps,
        ),
    )


if __name__ == "__main__":
    main()
