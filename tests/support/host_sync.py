"""A spy for host synchronisation: every read of a tensor value back to the host fails.

On a GPU, ``.item()``, ``.tolist()``, ``bool(tensor)``, ``float(tensor)``, ``.cpu()`` and
``.numpy()`` wait for the device's queue to drain. ``NoHostSync`` is a ``TorchFunctionMode``
that raises on each of them, so code meant to run without host syncs can be checked on the CPU
(with ``attnkit.kernels.policy.numerics.use_path("device")``); on CUDA, ``cuda_sync_errors()`` adds
``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")
"""Tensor methods that read a value back to the host."""


class HostSync(AssertionError):
    """A value was read back to the host where none may be."""


class NoHostSync(TorchFunctionMode):
    """Raises :class:`HostSync` on every tensor read of :data:`READS` inside the block."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            raise HostSync(f"host sync: Tensor.{name}() in a call that must not sync")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def cuda_sync_errors() -> Iterator[None]:
    """``torch.cuda.set_sync_debug_mode("error")`` within the block (CUDA only)."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)
