"""torch's private fused CPU attention ops (the flash kernel behind CPU SDPA, forward and
backward, returning and taking the log-sum-exp) and the layout they read: one definition for
the backends that call them directly (:mod:`attnkit.kernels.blocksparse.tiles`,
:mod:`attnkit.kernels.causal_chunk`).

The ops read q, k, v, the output and its gradient through the strides of their batch, head and
row dims only: they assume a unit-stride last dim (and BLAS needs rows at least a row apart).
``FLASH`` / ``FLASH_BWD`` are None in a torch build without them.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FLASH", "FLASH_BWD", "unit_rows"]

FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
FLASH_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def unit_rows(t: Tensor) -> Tensor:
    """``t`` (..., L, d) with the layout the fused CPU ops read correctly: last dim of unit
    stride, rows at least d apart (any batch strides, 0 included). A copy only when needed."""
    n, d = t.shape[-2], t.shape[-1]
    if (d == 1 or t.stride(-1) == 1) and (n == 1 or t.stride(-2) >= d):
        return t
    return t.contiguous()
