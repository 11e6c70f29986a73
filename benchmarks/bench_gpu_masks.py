"""Structured masks on a CUDA GPU (issue 29, section 3): attnkit's ``flex`` backend (chosen by
``backend="auto"`` on CUDA) against compiled FlexAttention given the user's own ``mask_mod``
and ``create_block_mask``, and against SDPA with the dense boolean mask.

Rows (bf16, B = 4, H = 16, d = 64; ``--quick`` runs L = 1024 with few repeats). Without a CUDA
GPU every row is skipped with that reason (``case`` says SKIPPED, nothing is timed):

- ``gpu-{window,docs,pad}-{4k,16k}-{fwd,fwdbwd}``: steady state vs compiled Flex with the
  user's mask_mod and create_block_mask (target >= 0.98x); peak memory of both sides in the
  notes (``mem_ok``: attnkit <= Flex + 10 %);
- ``gpu-{window,docs,pad}-16k-sdpa``: forward vs SDPA with the dense bool mask (>= 20x);
- ``gpu-{window,docs,pad}-16k-build``: BlockMask build from attnkit's block maps (a fresh mask
  object, nothing cached) vs ``create_block_mask`` (target: at most half its time, >= 2x).

Masks: window-256 causal (``causal() & sliding_window(256)``); documents, 8 of random lengths
per batch row (sorted ids); key padding with lengths drawn in 30-100 % of L.

    python benchmarks/bench_gpu_masks.py --list
    python benchmarks/bench_gpu_masks.py --row gpu-window-16k-fwd [--quick]
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from common import interleaved_times, main, measure_pair, row
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import attnkit
from attnkit import masks
from attnkit.kernels import BACKENDS
from attnkit.kernels.call.base import AttentionCall

B, H, D, W = 4, 16, 64, 256
KINDS = ("window", "docs", "pad")
SKIP = "needs a CUDA GPU"
FLEX_PEER = "compiled Flex + user mask_mod + create_block_mask"
BUILD_PEER = "create_block_mask (user mask_mod)"


def _skipped(peer: str) -> dict:
    return dict(peer=peer, case=f"SKIPPED: {SKIP}", extra=dict(status=f"skipped: {SKIP}"))


def _needs_cuda(peer: str):
    """A row function skipped (with the reason) when there is no CUDA GPU."""

    def deco(fn):
        def run(*args):
            return fn(*args) if torch.cuda.is_available() else _skipped(peer)

        return run

    return deco


def _sync(fn):
    def run():
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def _inputs(length: int, grad: bool):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [
        torch.randn(
            B, H, length, D, generator=g, device="cuda", dtype=torch.bfloat16
        ).requires_grad_(grad)
        for _ in range(3)
    ]


def _case(kind: str, length: int):
    """(attnkit mask factory, the user's mask_mod, B for create_block_mask)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    if kind == "window":
        return (
            lambda: masks.causal() & masks.sliding_window(W),
            lambda b, h, q, k: (q >= k) & (q - k <= W),
            None,
        )
    if kind == "docs":
        cuts = torch.rand(B, 7, generator=g, device="cuda").mul(length).long().sort(-1).values
        pos = torch.arange(length, device="cuda")
        ids = (pos[None, :, None] >= cuts[:, None, :]).sum(-1)  # (B, L) sorted, 8 documents
        return lambda: masks.document(ids), lambda b, h, q, k: ids[b, q] == ids[b, k], B
    lens = (length * (0.3 + 0.7 * torch.rand(B, generator=g, device="cuda"))).long()
    return lambda: masks.key_padding(lens), lambda b, h, q, k: k < lens[b], B


def _prepare(kind: str, length: int, quick: bool, grad: bool = False):
    """(length run, q, k, v, mask factory, the user's mask_mod, B for create_block_mask)."""
    length = 1024 if quick else length
    return (length, *_inputs(length, grad), *_case(kind, length))


def _step(fn, q, k, v, backward: bool, go):
    def run():
        out = fn()
        if backward:
            torch.autograd.grad(out, (q, k, v), go)
        return out

    return _sync(run)


def _peak_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


@_needs_cuda(FLEX_PEER)
def _vs_flex(kind: str, length: int, backward: bool, quick: bool) -> dict:
    length, q, k, v, make, mod, bb = _prepare(kind, length, quick, backward)
    reps = 5 if quick else 30
    mask = make()
    bm = create_block_mask(mod, bb, None, length, length, device="cuda")
    flex = torch.compile(flex_attention)
    go = torch.randn_like(q)
    t0 = time.perf_counter()
    ours = _step(lambda: attnkit.scaled_dot_product_attention(q, k, v, mask), q, k, v, backward, go)
    ours()
    first_s = time.perf_counter() - t0
    theirs = _step(lambda: flex(q, k, v, block_mask=bm), q, k, v, backward, go)
    a, b = ours(), theirs()
    err = float((a.float() - b.float()).norm() / b.float().norm())
    res = measure_pair(ours, theirs, reps, rel_err=f"{err:.1e}", first_call_s=round(first_s, 2))
    mem_ours, mem_flex = _peak_mib(ours), _peak_mib(theirs)
    res["extra"].update(
        backend=attnkit.explain_dispatch(q, k, v, mask).chosen,
        attnkit_peak_mib=round(mem_ours, 1),
        flex_peak_mib=round(mem_flex, 1),
        mem_ok=mem_ours <= 1.1 * mem_flex,
    )
    what = "fwd+bwd" if backward else "fwd"
    return dict(case=f"{kind} L={length} {what} bf16 B={B} H={H}", peer=FLEX_PEER, **res)


@_needs_cuda("SDPA + dense bool mask")
def _vs_sdpa(kind: str, length: int, quick: bool) -> dict:
    length, q, k, v, make, _, _ = _prepare(kind, length, quick)
    mask = make()
    dense = mask.materialize(length, length).cuda()
    dense = dense[:, None] if dense.dim() == 3 else dense
    with torch.inference_mode():
        ours = _sync(lambda: attnkit.scaled_dot_product_attention(q, k, v, mask))
        theirs = _sync(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense))
        res = measure_pair(ours, theirs, 5 if quick else 10)
    return dict(
        case=f"{kind} L={length} fwd bf16 B={B} H={H}", peer="SDPA + dense bool mask", **res
    )


@_needs_cuda(BUILD_PEER)
def _build(kind: str, length: int, quick: bool) -> dict:
    length, q, k, v, make, mod, bb = _prepare(kind, length, quick)
    flex = BACKENDS["flex"]

    def ours():  # a fresh mask object: no cached block map, no cached plan
        return flex.plan(
            AttentionCall(
                "dot", q, k, v, mask=make(), scale=D**-0.5, dropout_p=0.0, return_weights=False
            )
        )

    def theirs():
        return create_block_mask(mod, bb, None, length, length, device="cuda")

    ours, theirs = _sync(ours), _sync(theirs)
    t = interleaved_times({"impl": ours, "peer": theirs}, warmup=1, reps=5 if quick else 10)
    impl_s, peer_s = sorted(t["impl"])[len(t["impl"]) // 2], sorted(t["peer"])[len(t["peer"]) // 2]
    return dict(
        case=f"{kind} L={length} BlockMask build", peer=BUILD_PEER, impl_s=impl_s, peer_s=peer_s,
        extra=dict(reps=len(t["impl"])),
    )  # fmt: skip


def _register() -> None:
    for kind in KINDS:
        for length, tag in ((4096, "4k"), (16384, "16k")):
            for backward in (False, True):
                what = "fwdbwd" if backward else "fwd"
                row(
                    f"gpu-{kind}-{tag}-{what}",
                    f"gpu {kind}",
                    f"L={length} {what} vs compiled Flex",
                    ">=0.98x",
                )(lambda quick, k=kind, n=length, bw=backward: _vs_flex(k, n, bw, quick))
        row(f"gpu-{kind}-16k-sdpa", f"gpu {kind}", "L=16384 fwd vs SDPA + dense mask", ">=20x")(
            lambda quick, k=kind: _vs_sdpa(k, 16384, quick)
        )
        row(f"gpu-{kind}-16k-build", f"gpu {kind}", "BlockMask build vs create_block_mask", ">=2x")(
            lambda quick, k=kind: _build(k, 16384, quick)
        )


_register()

if __name__ == "__main__":
    main()
