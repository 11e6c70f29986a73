"""GPU rows (issue 29, section 5): additive (Bahdanau) attention on the GPU.

- ``gpu-additive-2k``: (4, 2048, 128) queries and keys, h = 128, fp32, forward + backward,
  ``attnkit.additive_attention`` (the chunked backend, O(L*h) memory) against the tutorial
  implementation (``w_v . tanh(W_q q_i + W_k k_j)`` broadcast to (B, Lq, Lk, h)); target >= 10x,
  with the peak memory of each side in the notes (issue: >= 30x less).
- ``gpu-additive-16k``: the same at L = 16,384 with B = 1, where the tutorial implementation
  needs (16k)^2 x 128 x 4 bytes = 128 GiB: attnkit must run (judged by the row); the peer's
  out-of-memory error is reported.

Each row skips with its reason without a CUDA device.

    python benchmarks/bench_gpu_additive.py --list
    python benchmarks/bench_gpu_additive.py --row gpu-additive-2k [--quick]
"""

from __future__ import annotations

import torch
from common import main, row
from gpu_timing import cuda_missing, device_info, gpu_times, peak_mib, randn, skipped

import attnkit

PEER = "tutorial additive attention (broadcast tanh)"
H = 128


def _inputs(batch: int, length: int):
    xs = [randn((batch, length, H), torch.float32, True, seed=i) for i in range(3)]
    ws = [randn((H, H), torch.float32, True, seed=3), randn((H, H), torch.float32, True, seed=4)]
    ws.append(randn((H,), torch.float32, True, seed=5))
    for w in ws:
        w.data.mul_(H**-0.5)
    return xs + ws


def tutorial(q, k, v, w_q, w_k, w_v):
    """The tutorial's formulation: every (i, j, h) tanh entry at once."""
    s = torch.tanh((q @ w_q.T)[:, :, None, :] + (k @ w_k.T)[:, None, :, :]) @ w_v
    return torch.softmax(s, dim=-1) @ v


def _step(fn, xs):
    def run():
        out = fn(*xs)
        out.sum().backward()

    return run


def _additive(batch: int, length: int, quick: bool, peer_may_fail: bool) -> dict:
    why = cuda_missing()
    if why:
        return skipped(why, PEER)
    length = min(length, 1024) if quick else length
    xs = _inputs(batch, length)
    ours = _step(attnkit.additive_attention, xs)
    extra = dict(device_info())
    extra["attnkit_peak_mib"] = round(peak_mib(ours), 1)
    try:
        peer = _step(tutorial, xs)
        extra["peer_peak_mib"] = round(peak_mib(peer), 1)
        t = gpu_times({"impl": ours, "peer": peer}, warmup=1, reps=3 if quick else 7)
        extra["memory_ratio"] = round(extra["peer_peak_mib"] / extra["attnkit_peak_mib"], 1)
        res = dict(impl_s=t["impl"], peer_s=t["peer"])
    except torch.OutOfMemoryError as e:
        if not peer_may_fail:
            raise
        torch.cuda.empty_cache()
        extra["peer"] = f"out of memory: {str(e).splitlines()[0][:120]}"
        t = gpu_times({"impl": ours}, warmup=1, reps=3)
        res = dict(impl_s=t["impl"], peer_s=None, target_met=True)
    return dict(
        res,
        peer=PEER,
        case=f"({batch}, {length}, {H}) q, k, v, h = {H}, fp32, fwd+bwd",
        extra=extra,
    )


@row("gpu-additive-2k", "gpu additive", "(4, 2048, 128), h=128, fp32, fwd+bwd", ">=10x")
def additive_2k(quick: bool) -> dict:
    return _additive(4, 2048, quick, peer_may_fail=False)


@row("gpu-additive-16k", "gpu additive", "(1, 16384, 128), h=128: runs where the peer OOMs")
def additive_16k(quick: bool) -> dict:
    return _additive(1, 16384, quick, peer_may_fail=True)


if __name__ == "__main__":
    main()
