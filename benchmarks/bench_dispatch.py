"""The forced-backend table: for each call with a structured mask, ``backend="auto"`` against
every backend that can serve the call, all timed alternately in one process.

Each row's attnkit time is auto's; its peer is the fastest servable backend of the same run
(named in the notes with every backend's time and what auto chose), so the ratio is
best / auto: 1.0x when auto picked the best, below when it did not. Target: auto within 10% of
the best (>= 0.9x) on every row. Each row also notes the CPU (model, torch capability, native
bf16) and the dispatch constants' source (built-in defaults or ``attnkit tune``).

Rows (float32, d = 64 unless said; forward under inference mode unless "fwd+bwd"):

- windows at L = 2048 (narrow, near the crossover), causal (top-left and bottom-right with
  Lq < Lk), documents, prefix-LM, key padding shared by the batch, a window with causal
  fwd+bwd, and the attention call of ``hf-bert-embed`` (B = 32, H = 12, L = 255, d = 32, key
  padding varying per element).

``--quick`` runs L = 512 (BERT L = 128) with two repeats.

    python benchmarks/bench_dispatch.py --list
    python benchmarks/bench_dispatch.py --row dispatch-window-2k [--quick]
"""

from __future__ import annotations

import statistics

import torch
from common import cpu_line, interleaved_times, main, qkv, row

import attnkit
from attnkit import kernels
from attnkit import masks as M


def _tuning() -> str:
    from attnkit.kernels.tuning import current

    t = current()
    return f"measured by attnkit tune on {t.measured_on}" if t.measured else "built-in defaults"


def _servable(q, k, v, mask) -> list[str]:
    """Every registered dot-product backend that can serve the call (forced)."""
    out = []
    for name, b in kernels.BACKENDS.items():
        if "dot" in b.kinds and attnkit.explain_dispatch(q, k, v, mask, backend=name).chosen:
            out.append(name)
    return out


def compare(q, k, v, mask, quick: bool, train: bool = False) -> dict:
    """auto against every servable backend: the row fields (impl auto, peer the best)."""
    names = _servable(q, k, v, mask)
    chose = str(attnkit.explain_dispatch(q, k, v, mask).chosen)

    def call(backend):
        def fwd():
            with torch.inference_mode():
                attnkit.scaled_dot_product_attention(q, k, v, mask, backend=backend)

        def fwd_bwd():
            out = attnkit.scaled_dot_product_attention(q, k, v, mask, backend=backend)
            out.sum().backward()

        return fwd_bwd if train else fwd

    fns = {"auto": call("auto")} | {n: call(n) for n in names}
    times = interleaved_times(fns, warmup=1, reps=2 if quick else 5)
    med = {n: statistics.median(t) for n, t in times.items()}
    best = min(names, key=med.get)
    return dict(
        impl_s=med["auto"],
        peer_s=med[best],
        peer=f"best forced: {best}",
        extra={
            "auto_chose": chose,
            "ms": {n: round(s * 1e3, 2) for n, s in med.items()},
            "ratio_of_mins": round(min(times[best]) / min(times["auto"]), 3),
            "cpu": cpu_line(),
            "tuning": _tuning(),
        },
    )


def _length(quick: bool) -> int:
    return 512 if quick else 2048


@row("dispatch-window-2k", "dispatch", "window |i-j|<=128, L=2048, B=1 H=8", ">=0.9x")
def window(quick: bool) -> dict:
    n = _length(quick)
    return dict(compare(*qkv(n), M.sliding_window(128), quick), case=f"window 128, L={n}")


@row("dispatch-window-wide-2k", "dispatch", "window |i-j|<=700, L=2048 (near crossover)", ">=0.9x")
def window_wide(quick: bool) -> dict:
    n = _length(quick)
    w = n * 700 // 2048
    return dict(compare(*qkv(n), M.sliding_window(w), quick), case=f"window {w}, L={n}")


@row("dispatch-causal-2k", "dispatch", "causal (top-left), L=2048", ">=0.9x")
def causal(quick: bool) -> dict:
    n = _length(quick)
    return dict(compare(*qkv(n), M.causal(), quick), case=f"causal, L={n}")


@row("dispatch-causal-chunk", "dispatch", "bottom-right causal, Lq=256, Lk=2048", ">=0.9x")
def causal_chunk(quick: bool) -> dict:
    n = _length(quick)
    q, k, v = qkv(n)
    q = q[:, :, : n // 8].contiguous()
    mask = M.causal("bottom_right")
    return dict(compare(q, k, v, mask, quick), case=f"causal bottom-right, Lq={n // 8}, Lk={n}")


@row("dispatch-docs-2k", "dispatch", "4 documents, L=2048", ">=0.9x")
def docs(quick: bool) -> dict:
    n = _length(quick)
    cuts = torch.tensor([0, n * 3 // 10, n // 2, n * 8 // 10])
    ids = (torch.arange(n)[:, None] >= cuts[None, :]).sum(1) - 1
    return dict(compare(*qkv(n), M.document(ids), quick), case=f"4 documents, L={n}")


@row("dispatch-prefix-2k", "dispatch", "prefix-LM (prefix L/4), L=2048", ">=0.9x")
def prefix(quick: bool) -> dict:
    n = _length(quick)
    return dict(compare(*qkv(n), M.prefix_lm(n // 4), quick), case=f"prefix-LM {n // 4}, L={n}")


@row("dispatch-padding-2k", "dispatch", "key padding 60% shared by B=2, L=2048", ">=0.9x")
def padding(quick: bool) -> dict:
    n = _length(quick)
    mask = M.key_padding(torch.tensor([n * 6 // 10, n * 6 // 10]))
    return dict(compare(*qkv(n, batch=2), mask, quick), case=f"key padding 60%, B=2, L={n}")


@row("dispatch-local-causal-train", "dispatch", "window 128 & causal fwd+bwd, L=2048", ">=0.9x")
def local_causal_train(quick: bool) -> dict:
    n = _length(quick)
    mask = M.sliding_window(128) & M.causal()
    res = compare(*qkv(n, grad=True), mask, quick, train=True)
    return dict(res, case=f"window 128 & causal, fwd+bwd, L={n}")


@row("dispatch-bert-padding", "dispatch", "hf-bert-embed's call: (32,12,255,32) padding", ">=0.9x")
def bert_padding(quick: bool) -> dict:
    n = 128 if quick else 255
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, n + 1, (32,), generator=g)
    lengths[0] = n
    mask = M.KeyPadding(lengths)
    res = compare(*qkv(n, batch=32, heads=12, dim=32), mask, quick)
    return dict(res, case=f"BERT batch (32, 12, {n}, 32), lengths 16-{n}")


if __name__ == "__main__":
    main()
