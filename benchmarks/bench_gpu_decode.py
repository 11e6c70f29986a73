"""GPU rows (issue 29, section 4): one decode step against a long key/value cache on the GPU.

``gpu-decode-b{1,8}-{8k,64k}``: q (B, 32, 1, 128) against k, v (B, 8, Lk, 128) bf16 (grouped
heads), ``attnkit.grouped_query_attention`` against SDPA ``enable_gqa=True``; target >= 1.0x.
Each row skips with its reason without a CUDA device.

    python benchmarks/bench_gpu_decode.py --list
    python benchmarks/bench_gpu_decode.py --row gpu-decode-b1-8k [--quick]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from common import main, max_rel_err, row
from gpu_timing import cuda_missing, device_info, gpu_times, randn, skipped

from attnkit import functional

PEER = "torch SDPA enable_gqa"


def _decode(batch: int, lk: int, quick: bool) -> dict:
    why = cuda_missing()
    if why:
        return skipped(why, PEER)
    lk = min(lk, 8192) if quick else lk
    q = randn((batch, 32, 1, 128), torch.bfloat16, seed=0)
    k, v = (randn((batch, 8, lk, 128), torch.bfloat16, seed=i) for i in (1, 2))
    with torch.inference_mode():
        got = functional.grouped_query_attention(q, k, v)
        want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        t = gpu_times(
            {
                "impl": lambda: functional.grouped_query_attention(q, k, v),
                "peer": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            },
            reps=5 if quick else 30,
        )
    return dict(
        impl_s=t["impl"],
        peer_s=t["peer"],
        peer=PEER,
        case=f"q ({batch}, 32, 1, 128) against k, v ({batch}, 8, {lk}, 128) bf16",
        extra=dict(device_info(), max_rel_err=f"{max_rel_err(got.float(), want.float()):.1e}"),
    )


for _b in (1, 8):
    for _label, _lk in (("8k", 8192), ("64k", 65536)):
        row(
            f"gpu-decode-b{_b}-{_label}",
            "gpu decode",
            f"bf16, B={_b}, 32 query / 8 kv heads, Lk={_lk}, d=128",
            ">=1.0x",
        )(lambda quick, b=_b, n=_lk: _decode(b, n, quick))


if __name__ == "__main__":
    main()
