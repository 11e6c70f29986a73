"""Decode rows: one generated token's attention against a long key/value cache, attnkit
(``backend="auto"``, which takes the ``decode`` backend) against torch's SDPA in the same run.

- ``decode-2k`` / ``decode-8k`` / ``decode-32k``: q (1, 8, 1, 64) float32 against a cache of
  Lk = 2,048 / 8,192 / 32,768 keys (target >= 1.0x).
- ``decode-gqa-8k``: 8 query heads over 2 key/value heads, Lk = 8,192, against SDPA's
  ``enable_gqa=True`` (target >= 1.2x).
- ``decode-bf16-8k``: bfloat16, Lk = 8,192, against SDPA in bfloat16, on CPUs with native bf16
  (elsewhere the row reports that and judges nothing) (target >= 1.0x).
- ``decode-batch8-2k``: batch 8, Lk = 2,048 (target >= 1.0x).
- ``decode-kvcache``: a 4-layer ``nn`` decoder (MultiHeadAttention + feed-forward, d_model 512,
  8 heads) generating 256 tokens after a 2,048-token prompt with attnkit's ``KVCache``, against
  the same weights run with SDPA and a cache concatenated at every step (``torch.cat``, as
  transformers' DynamicCache does); tokens per second of the 256 steps (target >= 1.2x).

Each attention row also prints the bytes it reads per second (K and V once) next to a memory
bandwidth measured in the same run (a 256 MiB tensor copy: bytes read + written per second).
A 2k cache (8 MiB) fits in the CPU's last-level cache, so it can read faster than memory.

    python benchmarks/bench_decode.py --list
    python benchmarks/bench_decode.py --row decode-8k [--quick]
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from common import chosen_backend, main, max_rel_err, row, sdpa_pair_times

from attnkit import functional
from attnkit import masks as M
from attnkit.cpu import native_bf16
from attnkit.nn import KVCache, MultiHeadAttention

D = 64
D_FP32 = torch.float32
COPY_BYTES = 256 * 2**20


def bandwidth_gb_s(reps: int = 5) -> float:
    """Memory bandwidth from a large tensor copy: (bytes read + bytes written) / fastest time."""
    src = torch.ones(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * COPY_BYTES / best / 1e9


def _decode_row(lk: int, batch=1, heads=8, kv_heads=8, dtype=torch.float32, quick=False) -> dict:
    if quick:
        lk = min(lk, 1024)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, 1, D, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, lk, D, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, lk, D, generator=g).to(dtype)
    gqa = kv_heads != heads
    calls = max(1, int(2e6 // (batch * kv_heads * lk)))  # ~ tens of ms per round
    t, err = sdpa_pair_times(q, k, v, calls, reps=5 if quick else 21, gqa=gqa, warmup=2)
    bw = bandwidth_gb_s()
    impl_s, peer_s = (statistics.median(t[n]) / calls for n in ("impl", "peer"))
    read = (k.numel() + v.numel()) * k.element_size()
    return dict(
        impl_s=impl_s,
        peer_s=peer_s,
        peer="torch SDPA" + (" enable_gqa" if gqa else "") + (" bf16" if dtype != D_FP32 else ""),
        case=f"q ({batch}, {heads}, 1, {D}) against k, v ({batch}, {kv_heads}, {lk}, {D}) {dtype}",
        extra=dict(
            backend=chosen_backend(q, k, v) if not gqa else "decode (grouped)",
            rel_err=f"{err:.1e}",
            attnkit_us=round(impl_s * 1e6, 1),
            sdpa_us=round(peer_s * 1e6, 1),
            read_gb_s=round(read / impl_s / 1e9, 1),
            sdpa_read_gb_s=round(read / peer_s / 1e9, 1),
            copy_bw_gb_s=round(bw, 1),
            of_copy_bw=f"{read / impl_s / 1e9 / bw:.0%}",
            ratio_of_mins=round(min(t["peer"]) / min(t["impl"]), 3),
        ),
    )


@row("decode-2k", "decode", "fp32, Lq=1, Lk=2048, 8 heads", ">=1.0x")
def decode_2k(quick: bool) -> dict:
    return _decode_row(2048, quick=quick)


@row("decode-8k", "decode", "fp32, Lq=1, Lk=8192, 8 heads", ">=1.0x")
def decode_8k(quick: bool) -> dict:
    return _decode_row(8192, quick=quick)


@row("decode-32k", "decode", "fp32, Lq=1, Lk=32768, 8 heads", ">=1.0x")
def decode_32k(quick: bool) -> dict:
    return _decode_row(32768, quick=quick)


@row("decode-gqa-8k", "decode", "fp32, GQA 8/2 heads, Lk=8192", ">=1.2x")
def decode_gqa_8k(quick: bool) -> dict:
    return _decode_row(8192, kv_heads=2, quick=quick)


@row("decode-bf16-8k", "decode", "bf16, Lq=1, Lk=8192, 8 heads (native bf16 only)", ">=1.0x")
def decode_bf16_8k(quick: bool) -> dict:
    res = _decode_row(8192, dtype=torch.bfloat16, quick=quick)
    if not native_bf16():
        res["target_met"] = None
        res["extra"]["note"] = "this CPU has no native bf16: nothing to judge"
    return res


@row("decode-batch8-2k", "decode", "fp32, batch 8, Lq=1, Lk=2048, 8 heads", ">=1.0x")
def decode_batch8_2k(quick: bool) -> dict:
    return _decode_row(2048, batch=8, quick=quick)


# ---------------------------------------------------------------------------------------------
# a whole decoder: attnkit's KVCache against SDPA with a concatenated cache
# ---------------------------------------------------------------------------------------------
class _Layer(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attn = MultiHeadAttention(width, heads, batch_first=True)
        self.ff = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def ours(self, x, cache: KVCache, mask):
        x = x + self.attn(self.norm1(x), mask=mask, cache=cache)[0]
        return x + self.ff(self.norm2(x))

    def peer(self, x, kv: list, causal: bool):
        """The same weights with torch's SDPA and a cache grown by torch.cat."""
        a, h = self.attn, self.attn.num_heads
        y = self.norm1(x)
        q, k, v = (functional.split_heads(t, h) for t in a.in_proj.qkv(y))
        if kv:
            k, v = torch.cat([kv[0], k], dim=-2), torch.cat([kv[1], v], dim=-2)
        kv[:] = [k, v]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        x = x + a.out_proj(functional.merge_heads(o))
        return x + self.ff(self.norm2(x))


@row("decode-kvcache", "decode", "nn decoder, 256 tokens after a 2048-token prompt", ">=1.2x")
def decode_kvcache(quick: bool) -> dict:
    prompt, new, width, heads, layers = (256, 32, 256, 4, 2) if quick else (2048, 256, 512, 8, 4)
    torch.manual_seed(0)
    model = torch.nn.ModuleList(_Layer(width, heads) for _ in range(layers)).eval()
    x0 = torch.randn(1, prompt, width)

    def run(side: str):
        """(seconds of the ``new`` decode steps, their outputs) for one side."""
        caches = [KVCache() if side == "impl" else [] for _ in model]

        def step(layer, x, c, prompt: bool):
            if side == "impl":
                return layer.ours(x, c, M.causal() if prompt else None)
            return layer.peer(x, c, prompt)

        x = x0
        for layer, c in zip(model, caches, strict=True):
            x = step(layer, x, c, True)
        t0 = time.perf_counter()
        y, outs = x[:, -1:], []
        for _ in range(new):
            for layer, c in zip(model, caches, strict=True):
                y = step(layer, y, c, False)
            outs.append(y)
        return time.perf_counter() - t0, torch.cat(outs, 1)

    times: dict[str, list[float]] = {"impl": [], "peer": []}
    with torch.inference_mode():
        err = max_rel_err(run("impl")[1], run("peer")[1])
        for r in range(2 if quick else 5):
            for name in ("impl", "peer") if r % 2 == 0 else ("peer", "impl"):
                times[name].append(run(name)[0])
    impl_s, peer_s = statistics.median(times["impl"]), statistics.median(times["peer"])
    return dict(
        impl_s=impl_s,
        peer_s=peer_s,
        peer="same weights, torch SDPA + torch.cat cache",
        case=f"{layers} layers, d_model {width}, {heads} heads: {new} tokens after {prompt}",
        extra=dict(
            attnkit_tok_s=round(new / impl_s, 1),
            sdpa_tok_s=round(new / peer_s, 1),
            rel_err=f"{err:.1e}",
            ratio_of_mins=round(min(times["peer"]) / min(times["impl"]), 3),
        ),
    )


if __name__ == "__main__":
    main()
