"""Attention backends, one file each, and the registry the dispatcher reads.

``BACKENDS`` maps a name to a backend instance; :mod:`attnkit.kernels.dispatch` holds the
preference order (``preference(kind)``) and chooses the backend of each call.
"""

from __future__ import annotations

from attnkit.kernels.additive_fused import AdditiveFusedBackend
from attnkit.kernels.base import AttentionCall, Backend
from attnkit.kernels.blocksparse import BlocksparseBackend
from attnkit.kernels.decode import DecodeBackend
from attnkit.kernels.dense import DenseBackend
from attnkit.kernels.torch_math import MathBackend

BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        DecodeBackend(),
        BlocksparseBackend(),
        DenseBackend(),
        AdditiveFusedBackend(),
        MathBackend(),
    )
}

# the preference order and the choice live in kernels/dispatch.py (imported last: it reads BACKENDS)
from attnkit.kernels.dispatch import preference  # noqa: E402

__all__ = ["BACKENDS", "AttentionCall", "Backend", "preference"]
