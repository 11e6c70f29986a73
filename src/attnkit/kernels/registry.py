"""The registry of attention backends: ``BACKENDS`` maps a name to a backend instance.

:mod:`attnkit.kernels.dispatch` reads it (and holds the preference order); ``attnkit.kernels``
re-exports it. Tests may add or replace entries (``monkeypatch.setitem``): every reader looks
names up in this one dict.
"""

from __future__ import annotations

from attnkit.kernels.additive import AdditiveFusedBackend
from attnkit.kernels.additive.chunked import AdditiveChunkedBackend
from attnkit.kernels.blocksparse import BlocksparseBackend
from attnkit.kernels.call.backend import Backend
from attnkit.kernels.decode import DecodeBackend
from attnkit.kernels.dense import DenseBackend
from attnkit.kernels.flex import FlexBackend
from attnkit.kernels.math import MathBackend

__all__ = ["BACKENDS"]

BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        DecodeBackend(),
        FlexBackend(),
        BlocksparseBackend(),
        DenseBackend(),
        AdditiveFusedBackend(),
        AdditiveChunkedBackend(),
        MathBackend(),
    )
}
