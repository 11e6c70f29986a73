"""The autograd function of ``additive_fused``: projected inputs in, output out, and the
FlashAttention-style backward, both running the numba kernels of :mod:`.kernels`.

Forward: one work unit per (batch*head, block of BQ query rows), key blocks of BK
keys, online softmax (running max and sum per row), so neither the (Lq, Lk, h) tanh tensor nor
the (Lq, Lk) score matrix ever exists. It stores the output and each row's max and 1 / sum.

Backward: recomputes the scores per (4 rows, key block) tile with exactly the forward's
arithmetic, keeps tanh for the tile, and with dP_ij = dO_i . v_j, dS_ij = P_ij (dP_ij - D_i),
D_i = dO_i . O_i: d(qp_i) += w_v * sum_j dS_ij (1 - t_ij^2), d(kp_j) += w_v * sum_i dS_ij
(1 - t_ij^2), d(w_v) += sum_ij dS_ij t_ij, dv_j += sum_i P_ij dO_i. Work units are
(batch*head, interleaved share of the query blocks); each unit owns its rows of d(qp) and its
own partial d(kp), dv, d(w_v) (summed by torch afterwards), so no two threads write the same
memory.

Shape legend: ``BH`` flattened batch dims, ``Lq``/``Lk`` query/key length, ``h`` additive hidden
width, ``dv`` value width.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnkit.kernels.additive.tiles import MaskTiles
from attnkit.kernels.numba import runtime

EXP_LIMIT = 21.5
"""Largest |qp|, |kp| for the exp form of tanh (e^(4 * 21.5) = e^86 < float32 max e^88.7)."""

EXP_MIN = 2.0**-4
"""Smallest max(|qp|, |kp|) for the exp form: (p - 1) / (p + 1) with p = e^(2x) near 1 loses
relative precision as |x| shrinks (about eps / |2x|); when every projection is that small the
kernels use tanh_f32, whose error stays relative (3.2e-7) down to the smallest floats."""

_HERE = Path(__file__).resolve().parent
KERNEL_FILES = (
    _HERE / "kernels.py",
    _HERE / "tiles.py",
    _HERE.parent / "numba" / "nbmath.py",
    _HERE.parent / "numba" / "memory.py",
)
"""The files the compiled kernels depend on (their hash names the numba cache directory)."""


def load_kernels() -> ModuleType:
    """The numba kernel module :mod:`.kernels` (imported on first use; each kernel compiles, or
    loads from numba's disk cache, on its first call: a few seconds cold)."""
    return runtime.load_kernels("attnkit.kernels.additive.kernels", KERNEL_FILES)


def _np(t: Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def tanh_operands(qp: Tensor, kp: Tensor) -> tuple[np.ndarray, np.ndarray, bool]:
    """What the kernels evaluate tanh(qp_i + kp_j) from: (a (BH, Lq, h), bt (BH, h, Lk), direct).

    Fast form (``direct`` False): a = exp(2 qp), bt = exp(2 kp)ᵀ, and with p = a b,
    tanh(qp + kp) = (p - 1) / (p + 1): a product and one division per entry instead of a
    rational function (about half the instructions, and more accurate: rms error 3.5e-8 against
    4.9e-8 for tanh_f32). It needs |qp|, |kp| <= EXP_LIMIT (so that p stays a normal float32);
    otherwise ``direct`` is True, a = qp, bt = kpᵀ and the kernels call tanh_f32.
    """
    qp, kt = qp.detach(), kp.detach().transpose(1, 2)
    top = max(float(qp.abs().max()), float(kt.abs().max()))
    if EXP_MIN <= top <= EXP_LIMIT:
        return _np(torch.exp(qp * 2)), _np(torch.exp(kt * 2)), False
    return _np(qp), _np(kt), True


class AdditiveFunction(torch.autograd.Function):
    """Additive attention of projected, finite float32 inputs: qp (BH, Lq, h), kp (BH, Lk, h),
    v (BH, Lk, dv), w_v (h,), mask tiles -> out (BH, Lq, dv); rows without an allowed key are 0
    with gradient 0."""

    @staticmethod
    def forward(ctx, qp: Tensor, kp: Tensor, v: Tensor, w_v: Tensor, tiles: MaskTiles) -> Tensor:
        bh, lq, _ = qp.shape
        a, bt, direct = tanh_operands(qp, kp)
        out = torch.empty((bh, lq, v.shape[2]), dtype=torch.float32)
        stats = torch.empty((bh, lq, 2), dtype=torch.float32)  # row max, 1 / row sum
        args = (a, bt, direct, _np(w_v), _np(v), *tiles.arrays(), out.numpy(), stats.numpy())
        runtime.launch(load_kernels().forward_units, args, bh * tiles.classes.shape[1])
        ctx.save_for_backward(qp, kp, v, w_v, out, stats)
        ctx.tiles = tiles
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        qp, kp, v, w_v, out, stats = ctx.saved_tensors
        bh, lq, h = qp.shape
        lk, dv = kp.shape[1], v.shape[2]
        d_out = d_out.to(torch.float32).contiguous()
        d_sum = (d_out * out).sum(-1)  # D_i = dO_i . O_i, (BH, Lq)
        nq = ctx.tiles.classes.shape[1]
        split = max(1, min(nq, -(-runtime.parts_per_thread() * torch.get_num_threads() // bh)))
        dq = torch.zeros((bh, lq, h), dtype=torch.float32)
        dkt = np.zeros((bh * split, h, lk), np.float32)
        dvt = np.zeros((bh * split, dv, lk), np.float32)
        dw = np.zeros((bh * split, h), np.float32)
        a, bt, direct = tanh_operands(qp, kp)
        args = (a, bt, direct, _np(w_v), _np(v.transpose(1, 2)), _np(d_out), _np(stats))
        args += (_np(d_sum), *ctx.tiles.arrays(), split, dq.numpy(), dkt, dvt, dw)
        runtime.launch(load_kernels().backward_units, args, bh * split)
        dkp = torch.from_numpy(dkt).reshape(bh, split, h, lk).sum(1).transpose(1, 2)
        dv_ = torch.from_numpy(dvt).reshape(bh, split, dv, lk).sum(1).transpose(1, 2)
        dwv = torch.from_numpy(dw).sum(0)
        return dq, dkp, dv_, dwv, None
