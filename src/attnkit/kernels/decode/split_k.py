"""The numba decode step: flash-decoding's split-K on torch's threads, K and V read once.

:func:`attend_split_k` runs :mod:`.nb_kernels` for a decode step whose mask allows every key of
its range (no mask, or one that :func:`attnkit.kernels.decode.keys.key_range` narrows to a
range every row allows): the (batch, key/value head) pairs are the row blocks, each with its
grouped query heads folded into rows; the keys of a block are split so that every thread has
work (``splits`` per block, at least :data:`MIN_SPLIT` keys each); one launch computes the
partial softmaxes of all (block, split) units on ``torch.get_num_threads()`` threads (torch's
own OpenMP threads through :mod:`attnkit.kernels.numba.openmp`, each claiming units from a shared
counter; a Python thread pool where torch has no OpenMP), and one call combines them.

K and V may be float32 or bfloat16 (read as bfloat16, widened to float32 exactly, accumulated
in float32: policy P4); q is used in float32; the output comes back in q's dtype. Returns None
when the scores or the output break the policy (the caller redoes the step exactly).

Shape legend: ``N`` row blocks (batch x key/value heads), ``R`` rows per block (grouped query
heads x Lq), ``n`` keys in range, ``dk``/``dv`` widths.
"""

from __future__ import annotations

import array
import functools
import struct
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from attnkit.kernels.numba import contention, openmp, runtime

__all__ = ["MIN_SPLIT", "ONE_THREAD_BYTES", "attend_split_k", "numba_missing"]

MIN_SPLIT = 256
"""Fewest keys of one split: below it the partial softmax's fixed cost outweighs the work."""

ONE_THREAD_BYTES = 2**18
"""k and v bytes below which the step runs in the calling thread: handing work to another
thread costs more than reading this much."""

KERNEL_FILES = [
    Path(__file__).with_name("nb_kernels.py"),
    Path(__file__).resolve().parent.parent / "numba" / "nbmath.py",
    Path(__file__).resolve().parent.parent / "numba" / "memory.py",
]


def numba_missing() -> str | None:
    """None when the numba decode kernels can run, else why not."""
    return runtime.numba_missing()


@functools.cache
def _kernels() -> ModuleType:
    return runtime.load_kernels("attnkit.kernels.decode.nb_kernels", KERNEL_FILES)


def _blocks(x: Tensor) -> tuple[Tensor, int, int, int]:
    """x (..., n, d) read as (N, n, d) without a copy where it can be: (x or a contiguous copy,
    N, stride between blocks, stride between rows), in elements, with unit stride along d."""
    shape, stride = x.shape, x.stride()
    if stride[-1] == 1:
        blocks, step, want = 1, 0, None
        for size, st in zip(reversed(shape[:-2]), reversed(stride[:-2]), strict=True):
            if size == 1:
                continue
            if want is None:
                step = st
            elif st != want:
                break
            want = st * size
            blocks *= size
        else:
            return x, blocks, step, stride[-2]
    x = x.contiguous()
    return (
        x,
        x.numel() // (shape[-2] * shape[-1]) if x.numel() else 0,
        shape[-2] * shape[-1],
        shape[-1],
    )


def splits_for(blocks: int, n: int, threads: int) -> int:
    """Key splits per row block: enough units for every thread (two per thread when the blocks
    alone are fewer), each split at least MIN_SPLIT keys."""
    if blocks >= 2 * threads or threads == 1:
        return 1
    return max(1, min(-(-2 * threads // blocks), n // MIN_SPLIT))


def attend_split_k(q: Tensor, k: Tensor, v: Tensor, scale: float, limit: float) -> Tensor | None:
    """out (..., dv) float32, shaped as q, for k (..., n, dk) and v (..., n, dv) (float32, or
    bfloat16 k and v of one dtype) read as N row blocks (N = the product of their leading dims),
    and q (..., dk) whose entries are N blocks of R rows (q (N, R, dk); for grouped heads, the
    g query heads of a key/value head: q (..., G, g, Lq, dk)); every key allowed. None when a
    score is not strictly inside (-limit, limit) or an output entry is not finite."""
    kern = _kernels()
    if q.dtype != torch.float32 or not q.is_contiguous():
        q = q.to(torch.float32).contiguous()
    k, blocks, ks0, ks1 = _blocks(k)
    v, _, vs0, vs1 = _blocks(v)
    dk, n, dv = q.shape[-1], k.shape[-2], v.shape[-1]
    rows = q.numel() // (blocks * dk)
    item = k.element_size()
    threads = 1 if (k.numel() + v.numel()) * item < ONE_THREAD_BYTES else torch.get_num_threads()
    splits = splits_for(blocks, n, threads)
    chunk = -(-n // splits)
    splits = -(-n // chunk)
    units = blocks * splits
    part = torch.empty(units * (rows * (dv + 2) + 1))  # m, l, acc of every unit, then its flag
    m_addr = part.data_ptr()
    l_addr = m_addr + units * rows * 4
    acc_addr = l_addr + units * rows * 4
    bad_addr = acc_addr + units * rows * dv * 4  # int32 flags in the last units words
    # the step's block: nb_kernels.HEAD words (scale and limit as float64 bits), then its ARGS
    bits = struct.unpack("qq", struct.pack("dd", scale, limit))
    block = array.array("q", (
        0, units, *bits, int(item == 2), q.data_ptr(), k.data_ptr(), v.data_ptr(),
        (blocks - 1) * ks0 + (n - 1) * ks1 + dk, (blocks - 1) * vs0 + (n - 1) * vs1 + dv,
        ks0, ks1, vs0, vs1, rows, n, dk, dv, chunk, splits, m_addr, l_addr, acc_addr, bad_addr,
    ))  # fmt: skip
    # the units are fixed above by the configured threads; the team that claims them may be
    # smaller on a contended machine (no change to the result)
    addr, team = block.buffer_info()[0], min(units, contention.team(threads))
    if team == 1:
        kern.run_units.ctypes(addr)
    elif openmp.available():
        openmp.parallel(kern.run_units.address, addr, team)
    else:  # each pool thread claims units from the block until none is left
        runtime.launch(lambda first, step: kern.run_units.ctypes(addr), (), team)
    out = torch.empty(q.shape[:-1] + (dv,))
    if kern.combine(m_addr, l_addr, acc_addr, bad_addr, out.data_ptr(), blocks, splits, rows, dv):
        return None
    return out
