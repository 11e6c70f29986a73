"""GPU rows (issue 29, section 2): dense and causal attention against torch's SDPA on the GPU.

- ``gpu-dense-{1k,4k,16k}-{fwd,fwdbwd}`` and ``gpu-causal-...``: q, k, v (1, 16, L, 64), no
  mask / ``masks.causal()`` against SDPA / SDPA ``is_causal=True``, in bf16, fp16 and fp32; the
  row's ratio is the worst of the three dtypes (each in the notes); target >= 0.97x.
- ``gpu-overhead-dense`` / ``gpu-overhead-causal``: host time per call at (4, 16, 64, 64) bf16
  above SDPA's (µs); target <= 15 µs (judged by the row).

Each row skips with its reason without a CUDA device.

    python benchmarks/bench_gpu_dense.py --list
    python benchmarks/bench_gpu_dense.py --row gpu-causal-4k-fwd [--quick]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from common import main, max_rel_err, row
from gpu_timing import cuda_missing, device_info, gpu_times, host_times, randn, skipped

import attnkit
from attnkit import masks as M

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OVERHEAD_US = 15.0


def _pair(kind: str, length: int, dtype: torch.dtype, backward: bool):
    q, k, v = (randn((1, 16, length, 64), dtype, backward, seed=i) for i in range(3))
    mask = M.causal() if kind == "causal" else None
    causal = kind == "causal"

    def ours():
        out = attnkit.scaled_dot_product_attention(q, k, v, mask)
        if backward:
            out.sum().backward()
        return out

    def peer():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if backward:
            out.sum().backward()
        return out

    return ours, peer


def _speed_row(kind: str, length: int, backward: bool, quick: bool) -> dict:
    peer = "torch SDPA" + (" is_causal" if kind == "causal" else "")
    why = cuda_missing()
    if why:
        return skipped(why, peer)
    length = min(length, 1024) if quick else length
    ratios, extra = {}, dict(device_info())
    impl_total = peer_total = 0.0
    for dtype in DTYPES:
        ours, theirs = _pair(kind, length, dtype, backward)
        with torch.no_grad():
            err = max_rel_err(ours().float(), theirs().float()) if not backward else None
        t = gpu_times({"impl": ours, "peer": theirs}, reps=5 if quick else 20)
        name = str(dtype).removeprefix("torch.")
        ratios[name] = t["peer"] / t["impl"]
        extra[f"{name}_ms"] = f"{t['impl'] * 1e3:.3f} vs {t['peer'] * 1e3:.3f}"
        if err is not None:
            extra[f"{name}_max_rel_err"] = f"{err:.1e}"
        impl_total, peer_total = impl_total + t["impl"], peer_total + t["peer"]
    worst = min(ratios, key=ratios.get)
    extra.update(ratios={k: round(r, 3) for k, r in ratios.items()}, worst=worst)
    return dict(
        impl_s=impl_total,
        peer_s=peer_total,
        peer=peer,
        case=f"(1, 16, {length}, 64) bf16/fp16/fp32 " + ("fwd+bwd" if backward else "fwd"),
        target_met=ratios[worst] >= 0.97,
        extra=extra,
    )


def _overhead_row(kind: str, quick: bool) -> dict:
    peer = "torch SDPA" + (" is_causal" if kind == "causal" else "")
    why = cuda_missing()
    if why:
        return skipped(why, peer)
    q, k, v = (randn((4, 16, 64, 64), torch.bfloat16, seed=i) for i in range(3))
    mask = M.causal() if kind == "causal" else None
    with torch.inference_mode():
        t = host_times(
            {
                "impl": lambda: attnkit.scaled_dot_product_attention(q, k, v, mask),
                "peer": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None),
            },
            calls=50 if quick else 200,
        )
    above = (t["impl"] - t["peer"]) * 1e6
    return dict(
        impl_s=t["impl"],
        peer_s=t["peer"],
        peer=peer,
        target_met=above <= OVERHEAD_US,
        extra=dict(device_info(), host_us_above_sdpa=round(above, 1)),
    )


for _kind in ("dense", "causal"):
    for _label, _length in (("1k", 1024), ("4k", 4096), ("16k", 16384)):
        for _mode, _bwd in (("fwd", False), ("fwdbwd", True)):
            row(
                f"gpu-{_kind}-{_label}-{_mode}",
                "gpu dense",
                f"{_kind}, (1, 16, {_length}, 64), {'fwd+bwd' if _bwd else 'fwd'}, 3 dtypes",
                ">=0.97x",
            )(lambda quick, k=_kind, n=_length, b=_bwd: _speed_row(k, n, b, quick))
    row(
        f"gpu-overhead-{_kind}",
        "gpu dense",
        f"{_kind}, host time per call above SDPA at (4, 16, 64, 64) bf16",
        f"<={OVERHEAD_US:g} us",
    )(lambda quick, k=_kind: _overhead_row(k, quick))


if __name__ == "__main__":
    main()
