"""The fused softcap path of the ``blocksparse`` backend: one numba pass between two products.

PyTorch's fused CPU kernel has no hook between q kᵀ and the softmax, and explicit tiles
(:mod:`~attnkit.kernels.blocksparse.dropout`) make a pass over memory per tensor operation
(tanh, scale, band edges, softmax). Calls with ``softcap`` whose mask is a band (causal, sliding
window, local-causal: ``Mask.as_band()``, no bias, shared by the batch and the heads), without
dropout, computed in float32, run instead as tiles of query rows against the keys their band
needs (window and causal skipping): s = q kᵀ (BLAS, q prescaled by scale / c), then one pass of
:mod:`~attnkit.kernels.blocksparse.softcap_kernels` per row (cap, the band's edges, softmax,
log-sum-exp), then P v (BLAS). The G query heads of a grouped call are folded into the rows
(k and v never repeated). The backward recomputes each tile's probabilities from the saved
log-sum-exp and, in the same pass, dS (1 - tanh²) from dP = dO vᵀ; dq, dk, dv are three more
products. Sinks join each row's denominator from the log-sum-exp
(:mod:`~attnkit.kernels.blocksparse.sinks`), with their gradient. Everything else (dropout,
other masks, biases, float64, no numba) keeps the explicit tiles.

(A numba kernel doing the products too, FlashAttention-style, was 6-8x slower per score than
BLAS in its q·k loops: numba cannot keep the accumulators in registers.)

Shape legend: ``...`` batch dims, ``H``/``Hkv`` heads, ``G`` = H / Hkv, ``N`` = batch * Hkv,
``R`` = Lq * G folded rows, ``d`` widths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from torch import Tensor

from attnkit.kernels.blocksparse.fold import fold_q, group_size, lead_dims, unfold_out
from attnkit.kernels.blocksparse.sinks import sink_forward, sink_grad
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.numba import runtime

CHUNK_ENTRIES = 2**23
"""Most score entries (over the batch-heads) of one tile. Measured (Gemma 2 shape, H 4 / Hkv 2,
d 64, L 8,192, causal, inference, 2 threads, load 13, medians of 3): 2**19 22.2 s, 2**21 5.5 s,
2**23 3.5 s, 2**24 3.6 s, against 5.7 s for the explicit tiles; training, window 128, L 2,048:
1.9 s against 3.0 s. Under load every tensor operation waits for both threads, so few large
tiles win."""

KERNEL_FILES = tuple(
    Path(__file__).resolve().parent.parent / "numba" / f for f in ("nbmath.py", "memory.py")
) + (Path(__file__).resolve().parent / "softcap_kernels.py",)


def load_kernels() -> ModuleType:
    """The numba kernel module (compiled, or loaded from the disk cache, on first use)."""
    return runtime.load_kernels("attnkit.kernels.blocksparse.softcap_kernels", KERNEL_FILES)


@dataclass(frozen=True)
class BandRows:
    """The band as key ranges: position i attends keys jlo[i] <= j < jhi[i] (int64, (Lq,);
    non-decreasing in i)."""

    jlo: np.ndarray
    jhi: np.ndarray


def band_rows(call: AttentionCall) -> BandRows:
    """The key range of every query position of the call's band mask
    (``lo <= j - i - offset <= hi``)."""
    band = call.mask.as_band()
    lq, lk = call.q_len, call.kv_len
    off = band.offset(lq, lk)
    lo = -(2**62) if band.lo == -math.inf else int(band.lo)
    hi = 2**62 if band.hi == math.inf else int(band.hi)
    i = torch.arange(lq)
    jlo = i + off + lo
    jhi = (i + off) + hi + 1
    jlo, jhi = jlo.clamp(0, lk), jhi.clamp(0, lk)
    jhi = torch.maximum(jhi, jlo)
    return BandRows(jlo.numpy().astype("int64"), jhi.numpy().astype("int64"))


def applies(call: AttentionCall, compute: torch.dtype) -> bool:
    """True when the fused path serves ``call`` computed in ``compute`` (module docstring)."""
    mask = call.mask
    return (
        call.softcap is not None
        and call.dropout_p == 0
        and compute == torch.float32
        and mask is not None
        and mask.as_band() is not None
        and not mask.has_bias
        and lead_dims(call) == 0
        and group_size(call) >= 1
        and runtime.numba_missing() is None
    )


def fused_attend(call: AttentionCall, sinks: Tensor | None) -> Tensor:
    """softmax(softcap(q kᵀ · scale) + band mask) v, (..., H, Lq, dv) in float32 (the caller
    casts back). ``sinks`` (H,) or None. Call only when :func:`applies`."""
    g = group_size(call)
    dv = call.v.shape[-1]
    q, k, v = (t.to(torch.float32) for t in (call.q, call.k, call.v))
    qf = fold_q(q, g)
    qf = qf.reshape((-1,) + qf.shape[-2:])
    k, v = k.reshape((-1,) + k.shape[-2:]), v.reshape((-1,) + v.shape[-2:])
    rows = None
    if sinks is not None:
        s = sinks.to(torch.float32)[:, None].expand(call.q.shape[-3:-1])  # (H, Lq)
        s = fold_q(s[..., None], g)[..., 0]  # (Hkv, R)
        rows = s.expand(call.k.shape[:-2] + s.shape[-1:]).reshape(qf.shape[:2])
    setup = Setup(g, float(call.scale), float(call.softcap), band_rows(call))
    out = SoftcapFn.apply(qf, k, v, setup, rows)
    out = out.reshape(call.k.shape[:-2] + out.shape[-2:])
    return unfold_out(out, g)[..., :dv]


@dataclass(frozen=True)
class Setup:
    """The fold G, the score scale, the cap and the band of a fused call."""

    fold: int
    scale: float
    cap: float
    band: BandRows


def _chunks(st: Setup, heads: int):
    """(i0, i1, kmin, kmax): position ranges of at most about CHUNK_ENTRIES scores (over the
    ``heads`` batch-heads and the fold) and the keys they need (the band's ranges are
    non-decreasing in i)."""
    b = st.band
    lq = b.jlo.shape[0]
    width = int((b.jhi - b.jlo).max()) if lq else 0
    i0 = 0
    while i0 < lq:
        per = heads * st.fold * max(1, width)
        n = max(1, CHUNK_ENTRIES // per)
        n = max(1, CHUNK_ENTRIES // (per + heads * st.fold * n))  # rows drift: +n keys
        i1 = min(lq, i0 + n)
        yield i0, i1, int(b.jlo[i0:i1].min()), int(b.jhi[i0:i1].max())
        i0 = i1


def _ranges(st: Setup, i0: int, i1: int, kmin: int):
    """Each folded row's allowed keys of positions i0:i1, counted from ``kmin``: (a, b)."""
    g = st.fold
    a = (st.band.jlo[i0:i1] - kmin).repeat(g)
    b = (st.band.jhi[i0:i1] - kmin).repeat(g)
    return a, b


def _np(t: Tensor):
    return t.detach().numpy()


class SoftcapFn(torch.autograd.Function):
    """The fused softcap attention on folded rows: q (N, R, dk), k (N, Lk, dk), v (N, Lk, dv)
    float32, ``sinks`` (N, R) or None -> (N, R, dv)."""

    @staticmethod
    def forward(ctx, q, k, v, setup: Setup, sinks):
        kern, g = load_kernels(), setup.fold
        qs = (q * (setup.scale / setup.cap)).contiguous()
        out = q.new_zeros(q.shape[:-1] + v.shape[-1:])
        lse = q.new_full(q.shape[:-1], -math.inf)
        cap = np.float32(setup.cap)
        for i0, i1, kmin, kmax in _chunks(setup, q.shape[0]):
            if kmax <= kmin:
                continue
            rows = slice(i0 * g, i1 * g)
            s = torch.bmm(qs[:, rows], k[:, kmin:kmax].transpose(-2, -1))
            a, b = _ranges(setup, i0, i1, kmin)
            part = lse[:, rows].contiguous()
            runtime.launch(
                kern.softmax_units, (s.numpy(), a, b, cap, part.numpy()), s.shape[0] * s.shape[1]
            )
            lse[:, rows] = part
            out[:, rows] = torch.bmm(s, v[:, kmin:kmax])
        if sinks is not None:
            out, lse = sink_forward(out, lse, sinks.detach())
        ctx.setup = setup
        ctx.save_for_backward(qs, k, v, out, lse, sinks)
        return out

    @staticmethod
    def backward(ctx, go):
        qs, k, v, out, lse, sinks = ctx.saved_tensors
        st, kern, g = ctx.setup, load_kernels(), ctx.setup.fold
        go = go.to(torch.float32)
        dd = (go * out).sum(-1)
        dq, dk, dv = torch.zeros_like(qs), torch.zeros_like(k), torch.zeros_like(v)
        cap = np.float32(st.cap)
        for i0, i1, kmin, kmax in _chunks(st, qs.shape[0]):
            if kmax <= kmin:
                continue
            rows, keys = slice(i0 * g, i1 * g), slice(kmin, kmax)
            s = torch.bmm(qs[:, rows], k[:, keys].transpose(-2, -1))
            dp = torch.bmm(go[:, rows], v[:, keys].transpose(-2, -1))
            a, b = _ranges(st, i0, i1, kmin)
            l_, d_ = lse[:, rows].contiguous(), dd[:, rows].contiguous()
            runtime.launch(
                kern.grad_units,
                (s.numpy(), dp.numpy(), a, b, cap, _np(l_), _np(d_)),
                s.shape[0] * s.shape[1],
            )
            dv[:, keys] += torch.bmm(s.transpose(-2, -1), go[:, rows])
            dq[:, rows] += torch.bmm(dp, k[:, keys])
            dk[:, keys] += torch.bmm(dp.transpose(-2, -1), qs[:, rows])
        gs = None
        if sinks is not None and ctx.needs_input_grad[4]:
            gs = sink_grad(sinks, lse, dd)
        return dq.mul_(st.scale), dk.mul_(st.cap), dv, None, gs
