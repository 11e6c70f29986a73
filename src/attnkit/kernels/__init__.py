"""Attention backends, one file each, and the registry the dispatcher reads.

``BACKENDS`` maps a name to a backend instance; :func:`preference` gives, per score kind, the
order in which ``backend="auto"`` tries them (first one that can serve the call wins).
"""

from __future__ import annotations

from attnkit.kernels.additive_fused import AdditiveFusedBackend
from attnkit.kernels.base import AttentionCall, Backend
from attnkit.kernels.blocksparse import BlocksparseBackend
from attnkit.kernels.dense import DenseBackend
from attnkit.kernels.torch_math import MathBackend

BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        BlocksparseBackend(),
        DenseBackend(),
        AdditiveFusedBackend(),
        MathBackend(),
    )
}

_PREFERENCE = {
    "dot": ("blocksparse", "dense", "math"),
    "additive": ("additive_fused", "math"),
}


def preference(kind: str) -> tuple[str, ...]:
    """Backend names in the order ``backend="auto"`` tries them for score ``kind``."""
    return tuple(n for n in _PREFERENCE[kind] if n in BACKENDS)


__all__ = ["BACKENDS", "AttentionCall", "Backend", "preference"]
