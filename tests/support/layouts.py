"""Memory layouts as a test axis: tensors whose values a kernel reads through unusual strides.

``make(shape, layout, dtype, gen)`` returns ``(leaf, view)``: ``leaf`` is a fresh leaf tensor
(random normal values) and ``view(leaf)`` the tensor of ``shape`` a user would pass, in the named
layout. Apply ``view`` to a float64 copy of the leaf to build the reference input, and compare
``leaf.grad`` with the reference's leaf gradient to check gradients through the layout.

- ``contiguous``: a plain contiguous tensor.
- ``transposed``: stored as (..., d, L) and viewed transposed: the last dim has stride L, not 1.
- ``stepped``: every second row and column of a (..., 2L, 2d) tensor (``x[..., ::2, ::2]``).
- ``expanded``: the first dim expanded from size 1 (stride 0), as a shared k/v across a batch.
- ``channels_last``: a 4-D tensor in ``torch.channels_last`` memory format.
- ``offset``: a view starting 7 elements into a larger buffer (non-zero storage offset).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

LAYOUTS = ("contiguous", "transposed", "stepped", "expanded", "channels_last", "offset")


def make(
    shape: tuple[int, ...], layout: str, dtype: torch.dtype, gen: torch.Generator
) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """A leaf tensor and the function that views it as ``shape`` in ``layout``."""
    shape = tuple(shape)

    def randn(*s: int) -> Tensor:
        return torch.randn(s, generator=gen, dtype=torch.float64).to(dtype)

    if layout == "contiguous" or (layout in ("transposed", "stepped") and len(shape) < 2):
        return randn(*shape), lambda t: t
    if layout == "transposed":
        leaf = randn(*shape[:-2], shape[-1], shape[-2])
        return leaf, lambda t: t.transpose(-1, -2)
    if layout == "stepped":
        leaf = randn(*shape[:-2], 2 * shape[-2], 2 * shape[-1])
        return leaf, lambda t: t[..., ::2, ::2]
    if layout == "expanded":
        leaf = randn(1, *shape[1:])
        return leaf, lambda t: t.expand(shape)
    if layout == "channels_last":
        if len(shape) != 4:
            return randn(*shape), lambda t: t
        leaf = randn(*shape).contiguous(memory_format=torch.channels_last)
        return leaf, lambda t: t
    if layout == "offset":
        n = 1
        for s in shape:
            n *= s
        leaf = randn(n + 7)
        return leaf, lambda t: t[7:].view(shape)
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
