"""Structured masks: attnkit (``backend="auto"``, which picks ``blocksparse``) against torch SDPA
with the dense boolean mask, torch SDPA ``is_causal`` and compiled FlexAttention, side by side.

Rows (B = 1, H = 8, d = 64, float32; ``--quick`` runs L = 1024 with few repeats):

- sliding window |i - j| <= 128 at L = 16384: forward vs dense-mask SDPA (target >= 20x) and vs
  compiled FlexAttention's steady state (>= 1.0x; compile and ``create_block_mask`` times in the
  notes); forward+backward vs dense-mask SDPA forward+backward (>= 10x);
- documents at L = 16384 (8 documents of random lengths >= 64, as in the prototype): vs compiled
  FlexAttention (>= 1.0x) and vs dense-mask SDPA, forward and forward+backward (FlexAttention has
  no backward on CPU, so forward+backward is compared with dense-mask SDPA only);
- local-causal (window 128 & causal) forward+backward at L = 16384 vs dense-mask SDPA;
- causal at L = 4096 vs SDPA ``is_causal``: attnkit's auto dispatch sends a plain top-left causal
  mask to the ``dense`` backend (SDPA ``is_causal`` itself); the row times the ``blocksparse``
  kernel on the same mask (``causal("bottom_right")`` with Lq = Lk) and notes the auto time.

    python benchmarks/bench_masks.py --list
    python benchmarks/bench_masks.py --row swa-fwd-16k [--quick]
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

_CACHE = tempfile.mkdtemp(prefix="attnkit_inductor_")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _CACHE)  # compile times from a cold cache

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import (  # noqa: E402
    chosen_backend,
    interleaved_times,
    main,
    measure_pair,
    peak_memory_mib,
    qkv,
    rel_err,
    row,
    spread,
)

import attnkit  # noqa: E402
from attnkit import masks  # noqa: E402
from attnkit.kernels import blocksparse  # noqa: E402
from attnkit.kernels.call.base import AttentionCall  # noqa: E402

B, H, D, W = 1, 8, 64, 128


def _qkv(length: int, grad: bool = False) -> tuple[torch.Tensor, ...]:
    return qkv(length, B, H, D, grad=grad)


def _doc_ids(length: int) -> torch.Tensor:
    """8 documents of arbitrary (not block-aligned) lengths, each >= 64 tokens (prototype)."""
    rng = np.random.default_rng(0)
    while True:
        cuts = np.sort(rng.choice(np.arange(1, length), 7, replace=False))
        if np.diff(np.concatenate([[0], cuts, [length]])).min() >= 64:
            break
    ids = torch.zeros(length, dtype=torch.long)
    for c in cuts.tolist():
        ids[c:] += 1
    return ids


def _plan_s(q, k, v, mask_factory) -> float:
    """Seconds to build the block map and the plan for a fresh mask object (paid on the first
    call with a mask object and shape; later calls reuse it)."""
    t0 = time.perf_counter()
    blocksparse.make_plan(AttentionCall("dot", q, k, v, mask=mask_factory(), scale=D**-0.5))
    return round(time.perf_counter() - t0, 4)


def _dense_bool(mask: masks.Mask, length: int) -> torch.Tensor:
    return mask.materialize(length, length)


# ---------------------------------------------------------------------------------------------
# sliding window / documents vs dense-mask SDPA
# ---------------------------------------------------------------------------------------------
def _vs_dense_mask(length: int, reps: int, make_mask, what: str, backward: bool) -> dict:
    q, k, v = _qkv(length, grad=backward)
    mask = make_mask()
    dense = _dense_bool(mask, length)
    g = torch.randn(B, H, length, D, generator=torch.Generator().manual_seed(1))

    def ours():
        out = attnkit.scaled_dot_product_attention(q, k, v, mask)
        return torch.autograd.grad(out, (q, k, v), g) if backward else out

    def peer():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        return torch.autograd.grad(out, (q, k, v), g) if backward else out

    ctx = torch.enable_grad() if backward else torch.inference_mode()
    with ctx:
        a, b = ours(), peer()
        if backward:
            err = max(float(rel_err(x, y)) for x, y in zip(a, b, strict=True))
            err_s = f"grad_rel_err={err:.1e}"
        else:
            err_s = f"rel_err={rel_err(a, b)}"
        del a, b
        res = measure_pair(
            ours,
            peer,
            reps,
            backend=chosen_backend(q, k, v, mask),
            check=err_s,
            plan_s=_plan_s(q, k, v, make_mask),
        )
        res["extra"]["attnkit_peak_mib"] = round(peak_memory_mib(ours), 1)
        res["extra"]["peer_peak_mib"] = round(peak_memory_mib(peer), 1)
    kind = "fwd+bwd" if backward else "fwd"
    return dict(
        case=f"L={length} {kind}, {what}",
        peer="torch SDPA + dense bool mask" + (" fwd+bwd" if backward else ""),
        **res,
    )


@row("swa-fwd-16k", "sliding window 128", "L=16384 fwd vs dense-mask SDPA", ">=20x")
def swa_fwd_16k(quick: bool) -> dict:
    length, reps = (1024, 5) if quick else (16384, 5)
    return _vs_dense_mask(length, reps, lambda: masks.sliding_window(W), "|i-j|<=128", False)


@row("swa-fwdbwd-16k", "sliding window 128", "L=16384 fwd+bwd vs dense-mask SDPA", ">=10x")
def swa_fwdbwd_16k(quick: bool) -> dict:
    length, reps = (1024, 3) if quick else (16384, 3)
    return _vs_dense_mask(length, reps, lambda: masks.sliding_window(W), "|i-j|<=128", True)


@row("doc-fwd-16k", "documents", "L=16384 fwd vs dense-mask SDPA")
def doc_fwd_16k(quick: bool) -> dict:
    length, reps = (1024, 5) if quick else (16384, 5)
    ids = _doc_ids(length)
    return _vs_dense_mask(length, reps, lambda: masks.document(ids), "8 documents", False)


@row("doc-fwdbwd-16k", "documents", "L=16384 fwd+bwd vs dense-mask SDPA")
def doc_fwdbwd_16k(quick: bool) -> dict:
    length, reps = (1024, 3) if quick else (16384, 3)
    ids = _doc_ids(length)
    return _vs_dense_mask(length, reps, lambda: masks.document(ids), "8 documents", True)


@row("local-causal-fwdbwd-16k", "sliding window 128", "L=16384 fwd+bwd, window & causal")
def local_causal_fwdbwd_16k(quick: bool) -> dict:
    length, reps = (1024, 3) if quick else (16384, 3)
    make = lambda: masks.sliding_window(W, 0) & masks.causal()  # noqa: E731
    return _vs_dense_mask(length, reps, make, "local-causal 128", True)


# ---------------------------------------------------------------------------------------------
# vs compiled FlexAttention
# ---------------------------------------------------------------------------------------------
def _vs_flex(length: int, reps: int, make_mask, mask_mod, what: str) -> dict:
    q, k, v = _qkv(length)
    mask = make_mask()
    extra: dict = {}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        t0 = time.perf_counter()
        block_mask = create_block_mask(mask_mod, None, None, length, length, device="cpu")
        extra["create_block_mask_s"] = round(time.perf_counter() - t0, 3)
        flex = torch.compile(flex_attention, dynamic=False)
        with torch.inference_mode():
            t0 = time.perf_counter()
            ref = flex(q, k, v, block_mask=block_mask)
            extra["flex_first_call_s"] = round(time.perf_counter() - t0, 2)
    except Exception as e:  # torch.compile needs a working C++ toolchain; report why not
        extra["flex_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        with torch.inference_mode():
            t = interleaved_times(
                {"impl": lambda: attnkit.scaled_dot_product_attention(q, k, v, mask)}, 1, reps
            )
        return dict(
            case=f"L={length} fwd, {what}",
            impl_s=float(statistics.median(t["impl"])),
            peer_s=None,
            peer="compiled FlexAttention (failed)",
            extra=extra,
        )

    def ours():
        return attnkit.scaled_dot_product_attention(q, k, v, mask)

    def peer():
        return flex(q, k, v, block_mask=block_mask)

    with torch.inference_mode():
        extra["rel_err"] = rel_err(ours(), ref)
        res = measure_pair(ours, peer, reps, backend=chosen_backend(q, k, v, mask), **extra)
    steady = res["peer_s"]
    res["extra"]["flex_compile_s"] = round(res["extra"].pop("flex_first_call_s") - steady, 2)
    res["extra"]["flex_block_sparsity"] = f"{float(block_mask.sparsity()):.1f}%"
    res["extra"]["plan_s"] = _plan_s(q, k, v, make_mask)
    return dict(case=f"L={length} fwd, {what}", peer="compiled FlexAttention (steady state)", **res)


@row("swa-fwd-16k-flex", "sliding window 128", "L=16384 fwd vs compiled FlexAttention", ">=1.0x")
def swa_fwd_16k_flex(quick: bool) -> dict:
    length, reps = (1024, 5) if quick else (16384, 7)

    def swa(b, h, qi, kv):
        return (qi - kv).abs() <= W

    return _vs_flex(length, reps, lambda: masks.sliding_window(W), swa, "|i-j|<=128")


@row("doc-fwd-16k-flex", "documents", "L=16384 fwd vs compiled FlexAttention", ">=1.0x")
def doc_fwd_16k_flex(quick: bool) -> dict:
    length, reps = (1024, 5) if quick else (16384, 7)
    ids = _doc_ids(length)

    def doc(b, h, qi, kv):
        return ids[qi] == ids[kv]

    return _vs_flex(length, reps, lambda: masks.document(ids), doc, "8 documents")


# ---------------------------------------------------------------------------------------------
# causal
# ---------------------------------------------------------------------------------------------
@row("causal-4k", "causal", "L=4096 fwd vs SDPA is_causal")
def causal_4k(quick: bool) -> dict:
    length, reps = (1024, 5) if quick else (4096, 9)
    q, k, v = _qkv(length)
    mask = masks.causal("bottom_right")  # Lq = Lk: the causal mask, served by blocksparse
    plain = masks.causal()

    def ours():
        return attnkit.scaled_dot_product_attention(q, k, v, mask)

    def peer():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def auto():
        return attnkit.scaled_dot_product_attention(q, k, v, plain)

    with torch.inference_mode():
        err = rel_err(ours(), peer())
        t = interleaved_times({"impl": ours, "peer": peer, "auto": auto}, warmup=1, reps=reps)
    med = {key: float(statistics.median(ts)) for key, ts in t.items()}
    return dict(
        case=f"L={length} fwd, causal (blocksparse kernel)",
        impl_s=med["impl"],
        peer_s=med["peer"],
        peer="torch SDPA is_causal",
        extra=dict(
            backend=chosen_backend(q, k, v, mask),
            rel_err=err,
            reps=reps,
            spread=f"{spread(t['impl']):.0%}/{spread(t['peer']):.0%}",
            auto_backend_plain_causal=chosen_backend(q, k, v, plain),
            auto_plain_causal_s=round(med["auto"], 4),
            auto_ratio=round(med["peer"] / med["auto"], 3),
        ),
    )


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(_CACHE, ignore_errors=True)
