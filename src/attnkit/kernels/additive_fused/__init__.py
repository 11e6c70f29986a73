"""``additive_fused``: additive attention in fused numba kernels, O(L*h) memory, with backward.

One concept per module:

- :mod:`.backend`: the backend (what it serves) and :func:`additive_fused`, a call's way in;
- :mod:`.policy`: the NaN/inf/overflow policy for additive calls (shared with ``math``);
- :mod:`.autograd`: the autograd function (forward, FlashAttention-style backward);
- :mod:`.tiles`: the mask as EMPTY / FULL / packed PARTIAL tiles;
- :mod:`.runtime`: numba availability, disk cache, kernel loading, threads (any numba kernel);
- :mod:`.kernels`: the numba kernels themselves (plain ``@njit``; imported on first use).
"""

from __future__ import annotations

from attnkit.kernels.additive_fused.autograd import (
    EXP_LIMIT,
    AdditiveFunction,
    load_kernels,
    tanh_operands,
)
from attnkit.kernels.additive_fused.backend import AdditiveFusedBackend, additive_fused
from attnkit.kernels.additive_fused.policy import overflow_risk, run_additive
from attnkit.kernels.additive_fused.tiles import BLOCK_K, BLOCK_Q, MaskTiles, mask_tiles
from attnkit.kernels.numba_runtime import first_writable

__all__ = [
    "BLOCK_K",
    "BLOCK_Q",
    "EXP_LIMIT",
    "AdditiveFunction",
    "AdditiveFusedBackend",
    "MaskTiles",
    "additive_fused",
    "first_writable",
    "load_kernels",
    "mask_tiles",
    "overflow_risk",
    "run_additive",
    "tanh_operands",
]
