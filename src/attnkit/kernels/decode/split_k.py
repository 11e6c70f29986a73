"""The numba decode step: flash-decoding's split-K on torch's threads, K and V read once.

:func:`attend_split_k` runs :mod:`.nb_kernels` for a decode step whose mask allows every key of
its range (no mask, or one that :func:`attnkit.kernels.decode.keys.key_range` narrows to a
range every row allows): the (batch, key/value head) pairs are the row blocks, each with its
grouped query heads folded into rows; the keys of a block are split so that every thread has
work (``splits`` per block, at least :data:`MIN_SPLIT` keys each); one launch computes the
partial softmaxes of all (block, split) units on ``torch.get_num_threads()`` threads, and one
call combines them.

K and V may be float32 or bfloat16 (read as bfloat16, widened to float32 exactly, accumulated
in float32: policy P4); q is used in float32; the output comes back in q's dtype. Returns None
when the scores or the output break the policy (the caller redoes the step exactly).

Shape legend: ``N`` row blocks (batch x key/value heads), ``R`` rows per block (grouped query
heads x Lq), ``n`` keys in range, ``dk``/``dv`` widths.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from attnkit.kernels import numba_runtime as runtime

__all__ = ["MIN_SPLIT", "ONE_THREAD_BYTES", "attend_split_k", "numba_missing"]

MIN_SPLIT = 256
"""Fewest keys of one split: below it the partial softmax's fixed cost outweighs the work."""

ONE_THREAD_BYTES = 2**18
"""k and v bytes below which the step runs in the calling thread: handing work to another
thread costs more than reading this much."""

KERNEL_FILES = [
    Path(__file__).with_name("nb_kernels.py"),
    Path(__file__).resolve().parent.parent / "nbmath.py",
    Path(__file__).resolve().parent.parent / "nb_memory.py",
]


def numba_missing() -> str | None:
    """None when the numba decode kernels can run, else why not."""
    return runtime.numba_missing()


@functools.cache
def _kernels() -> ModuleType:
    return runtime.load_kernels("attnkit.kernels.decode.nb_kernels", KERNEL_FILES)


def _rows(x: Tensor) -> Tensor:
    """(N, n, d) with unit stride along d (a view when it already has it)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _span(x: Tensor) -> int:
    """Elements from x's first to one past its last, for (N, n, d) with unit stride along d."""
    return sum((s - 1) * st for s, st in zip(x.shape, x.stride(), strict=True)) + 1


def splits_for(blocks: int, n: int, threads: int) -> int:
    """Key splits per row block: enough units for every thread (two per thread when the blocks
    alone are fewer), each split at least MIN_SPLIT keys."""
    if blocks >= 2 * threads or threads == 1:
        return 1
    return max(1, min(-(-2 * threads // blocks), n // MIN_SPLIT))


def attend_split_k(q3: Tensor, k3: Tensor, v3: Tensor, scale: float, limit: float) -> Tensor | None:
    """out (N, R, dv) float32 for q3 (N, R, dk), k3 (N, n, dk), v3 (N, n, dv) (float32, or
    bfloat16 k3 and v3 of one dtype), every key allowed; None when a score is not strictly
    inside (-limit, limit) or an output entry is not finite."""
    kern = _kernels()
    q3 = q3.to(torch.float32).contiguous()
    k3, v3 = _rows(k3), _rows(v3)
    blocks, rows, dk = q3.shape
    n, dv = k3.shape[1], v3.shape[2]
    size = k3.numel() * k3.element_size() + v3.numel() * v3.element_size()
    threads = 1 if size < ONE_THREAD_BYTES else torch.get_num_threads()
    splits = splits_for(blocks, n, threads)
    chunk = -(-n // splits)
    splits = -(-n // chunk)
    units = blocks * splits
    part = torch.empty(units * rows * (dv + 2))  # m, l, acc of every unit
    bad = torch.empty(units, dtype=torch.int32)
    m_addr = part.data_ptr()
    l_addr = m_addr + units * rows * 4
    partials = kern.partials_bf16 if k3.dtype == torch.bfloat16 else kern.partials_f32
    args = (
        q3.data_ptr(), k3.data_ptr(), v3.data_ptr(), _span(k3), _span(v3),
        k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
        rows, n, dk, dv, chunk, splits, scale, limit,
        m_addr, l_addr, l_addr + units * rows * 4, bad.data_ptr(), units,
    )  # fmt: skip
    if units == 1 or threads == 1:
        partials(*args, 0, 1)
    else:
        runtime.launch(partials, args, min(units, threads))
    out = torch.empty(blocks, rows, dv)
    acc_addr, bad_addr = args[19], args[20]
    if kern.combine(m_addr, l_addr, acc_addr, bad_addr, out.data_ptr(), blocks, splits, rows, dv):
        return None
    return out
