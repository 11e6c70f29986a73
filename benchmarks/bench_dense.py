"""Dense fp32 attention: attnkit (backend "auto") against torch SDPA, side by side.

Rows (B = 1, H = 8, d = 64, float32): no mask at L = 1k, 4k, 16k (target >= 0.95x); top-left
causal at L = 4k (``attnkit.masks.causal()`` against SDPA ``is_causal=True``); forward+backward at
L = 4k; and the per-call overhead of attnkit (validation, dispatch and the NaN/overflow policy's
input scan) at L = 64, where the kernel time is small, and at the decode shape (one query row
against 2048 cached keys, 8 heads, and grouped-query with 2 key/value heads). ``--quick`` runs
L = 256 / 512 with few repeats.

    python benchmarks/bench_dense.py --list
    python benchmarks/bench_dense.py --row dense-4k [--quick]
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from common import chosen_backend, main, max_rel_err, measure_pair, qkv, row, sdpa_pair_times

import attnkit
from attnkit import masks

B, H, D = 1, 8, 64


def _qkv(length: int, grad: bool = False) -> tuple[torch.Tensor, ...]:
    return qkv(length, B, H, D, grad=grad)


def _forward_row(length: int, reps: int, causal: bool = False) -> dict:
    q, k, v = _qkv(length)
    mask = masks.causal() if causal else None

    def ours():
        return attnkit.scaled_dot_product_attention(q, k, v, mask)

    def peer():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    with torch.inference_mode():
        err = max_rel_err(ours(), peer())
        res = measure_pair(
            ours, peer, reps, backend=chosen_backend(q, k, v, mask), rel_err=f"{err:.1e}"
        )
    what = "causal" if causal else "no mask"
    return dict(
        case=f"L={length} fwd, {what}", peer="torch SDPA" + (" is_causal" if causal else ""), **res
    )


def _fwd_bwd_row(length: int, reps: int) -> dict:
    q, k, v = _qkv(length, grad=True)
    g = torch.randn(B, H, length, D, generator=torch.Generator().manual_seed(1))

    def ours():
        out = attnkit.scaled_dot_product_attention(q, k, v)
        return torch.autograd.grad(out, (q, k, v), g)

    def peer():
        out = F.scaled_dot_product_attention(q, k, v)
        return torch.autograd.grad(out, (q, k, v), g)

    err = max(max_rel_err(a, b) for a, b in zip(ours(), peer(), strict=True))
    res = measure_pair(ours, peer, reps, backend=chosen_backend(q, k, v), grad_rel_err=f"{err:.1e}")
    return dict(case=f"L={length} fwd+bwd, no mask", peer="torch SDPA fwd+bwd", **res)


@row("dense-1k", "dense fp32", "L=1024 fwd, no mask", ">=0.95x")
def dense_1k(quick: bool) -> dict:
    return _forward_row(256, 5) if quick else _forward_row(1024, 31)


@row("dense-4k", "dense fp32", "L=4096 fwd, no mask", ">=0.95x")
def dense_4k(quick: bool) -> dict:
    return _forward_row(512, 5) if quick else _forward_row(4096, 11)


@row("dense-16k", "dense fp32", "L=16384 fwd, no mask", ">=0.95x")
def dense_16k(quick: bool) -> dict:
    return _forward_row(512, 3) if quick else _forward_row(16384, 7)


@row("dense-causal-4k", "dense fp32", "L=4096 fwd, causal", ">=0.95x")
def dense_causal_4k(quick: bool) -> dict:
    return _forward_row(512, 5, causal=True) if quick else _forward_row(4096, 11, causal=True)


@row("dense-fwdbwd-4k", "dense fp32", "L=4096 fwd+bwd, no mask", ">=0.95x")
def dense_fwdbwd_4k(quick: bool) -> dict:
    return _fwd_bwd_row(256, 3) if quick else _fwd_bwd_row(4096, 5)


def _overhead(q, k, v, calls: int, quick: bool, gqa: bool = False) -> dict:
    """attnkit's fixed cost per call against SDPA on the same (small) inputs, inference mode:
    many calls per round, rounds interleaved, medians and fastest rounds per call."""
    calls = max(1, calls // 8) if quick else calls
    t, err = sdpa_pair_times(q, k, v, calls, reps=5 if quick else 21, gqa=gqa)
    # per call; the fastest rounds, as noise only adds time and the cost is a few µs
    ours_us, peer_us = min(t["impl"]) / calls * 1e6, min(t["peer"]) / calls * 1e6
    med_ours, med_peer = (float(statistics.median(t[n])) / calls for n in ("impl", "peer"))
    return dict(
        impl_s=med_ours,
        peer_s=med_peer,
        peer="torch SDPA" + (" enable_gqa" if gqa else ""),
        extra=dict(
            overhead_us=round(ours_us - peer_us, 1),
            median_overhead_us=round((med_ours - med_peer) * 1e6, 1),
            overhead_share_of_sdpa=round((med_ours - med_peer) / med_peer, 3),
            attnkit_best_us=round(ours_us, 1),
            sdpa_best_us=round(peer_us, 1),
            rel_err=f"{err:.1e}",
        ),
    )


OVERHEAD_TARGET_SHARE = 0.15
"""dense-overhead's target: the median extra time per call over SDPA at L = 64, as a share of
SDPA's own median call time there (a share travels between hosts; microseconds do not: the
same code measured 10 us on a quiet host and 30-39 us on a busy one)."""


@row(
    "dense-overhead",
    "dense fp32",
    "per-call overhead, L=64",
    f"overhead_share_of_sdpa <= {OVERHEAD_TARGET_SHARE:g}",
)
def dense_overhead(quick: bool) -> dict:
    """attnkit's fixed cost per call (validation, dispatch, the policy's input scan), from many
    calls on a tiny input; the target judges the median extra time per call as a share of
    SDPA's median call time (``overhead_share_of_sdpa``); ``median_overhead_us`` stays beside
    it."""
    res = _overhead(*_qkv(64), calls=400, quick=quick)
    res["target_met"] = res["extra"]["overhead_share_of_sdpa"] <= OVERHEAD_TARGET_SHARE
    return res


@row("dense-overhead-decode", "dense fp32", "per-call overhead, decode Lq=1, Lk=2048")
def dense_overhead_decode(quick: bool) -> dict:
    """One generated token's attention in one layer: q (1, 8, 1, 64) against a 2048-entry
    cache (1, 8, 2048, 64)."""
    q, k, v = _qkv(2048)
    return _overhead(q[:, :, -1:].contiguous(), k, v, calls=100, quick=quick)


@row("dense-overhead-decode-gqa", "dense fp32", "per-call overhead, decode GQA 8/2 heads, Lk=2048")
def dense_overhead_decode_gqa(quick: bool) -> dict:
    """As dense-overhead-decode with 2 key/value heads (grouped-query attention)."""
    q, k, v = _qkv(2048)
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    return _overhead(q[:, :, -1:].contiguous(), k, v, calls=100, quick=quick, gqa=True)


if __name__ == "__main__":
    main()
