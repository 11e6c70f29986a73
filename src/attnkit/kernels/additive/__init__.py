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

from attnkit.kernels.additive.autograd import (
    EXP_LIMIT,
    AdditiveFunction,
    load_kernels,
    tanh_operands,
)
from attnkit.kernels.additive.fused import AdditiveFusedBackend, additive_fused
from attnkit.kernels.additive.tiles import BLOCK_K, BLOCK_Q, MaskTiles, mask_tiles
from attnkit.kernels.numba.runtime import first_writable
from attnkit.kernels.policy.additive import overflow_risk, run_additive

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
