"""Element-wise dropout (training mode) with a counter-based keep mask, in one numba pass.

``torch.nn.functional.dropout`` on the CPU draws a float Bernoulli tensor (about 4.5 ns per
element on one core), scales it, then multiplies: in a small Transformer's training step the
residual, feed-forward and embedding dropouts cost about a tenth of the step. Here one pass
hashes the element's index with a seed drawn from torch's generator
(:mod:`attnkit.kernels.dropout.nb_kernels`), writes ``x * scale`` or 0 and a one-byte keep mask
for the backward (torch keeps a float mask, four bytes), about 0.4 ns per element.

Semantics (as torch's): element ``i`` is kept with probability 1 - p; the output is
``x * m`` with ``m = 1 / (1 - p)`` (rounded to the tensor's dtype) where kept and 0 where
dropped (a multiplication, so a dropped NaN or inf gives NaN, as in torch), and the gradient
is the incoming gradient times the same ``m``. ``p`` is resolved to 2**-32 (the keep test compares
a 32-bit word of the hash with ``threshold(p)``). One seed per call from torch's default
generator: ``torch.manual_seed`` and a restored RNG state reproduce the masks (not torch's own
masks: the stream differs).

Served: contiguous float32/float64 CPU tensors of at least :data:`MIN_ELEMENTS` elements,
0 < p < 1, numba usable, outside ``torch.compile`` (Inductor fuses its own dropout) and
``torch.func`` transforms. Everything
else goes to ``torch.nn.functional.dropout`` unchanged (:func:`served` says which).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.kernels.blocksparse.keep import draw_seed
from attnkit.kernels.numba import runtime

__all__ = ["CHUNK", "MIN_ELEMENTS", "DropoutFunction", "dropout", "served", "threshold"]

CHUNK = 1 << 16
"""Elements per work unit of a launch (even: a hash pair never straddles two units)."""
MIN_ELEMENTS = 8192
"""Smaller tensors go to torch: below this the Python around the kernel costs more than
torch's own draw (about 15 us per call against 4.5 ns per element: even at about 6,000)."""
WORD_BITS = 32
"""Bits of the hash compared with the threshold: p is resolved to 2**-32."""

_HERE = Path(__file__).resolve().parent
KERNEL_FILES = (_HERE / "nb_kernels.py",)
"""The files the compiled kernels depend on (their hash names the numba cache directory)."""


def load_kernels() -> ModuleType:
    """The numba kernel module :mod:`.nb_kernels` (imported on first use; compiled, or loaded
    from numba's disk cache, for float32 and float64 at once)."""
    return runtime.load_kernels("attnkit.kernels.dropout.nb_kernels", KERNEL_FILES)


def threshold(p: float) -> int:
    """The integer threshold of dropout probability ``p``: an element is kept when its 32-bit
    word of the hash is at least this (kept with probability 1 - threshold / 2**32)."""
    return round(p * (1 << WORD_BITS))


def served(x: Tensor, p: float) -> bool:
    """Whether :func:`dropout` runs the numba kernel on ``x`` (module docstring), not torch."""
    return (
        0.0 < p < 1.0
        and type(x) in (Tensor, torch.nn.Parameter)
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and x.numel() >= MIN_ELEMENTS
        and x.layout == torch.strided
        and x.is_contiguous()
        and not torch.compiler.is_compiling()
        and _has_storage(x)
        and runtime.numba_missing() is None
    )


def _has_storage(x: Tensor) -> bool:
    """False for a functorch-wrapped tensor (``torch.func.grad``, ``vmap``): no storage."""
    try:
        x.data_ptr()
    except RuntimeError:
        return False
    return True


def _flat(t: Tensor) -> np.ndarray:
    return t.detach().view(-1).numpy()


def _scale(p: float, dtype: torch.dtype) -> np.floating:
    """1 / (1 - p) in the tensor's dtype (as torch scales its Bernoulli mask)."""
    return (np.float32 if dtype == torch.float32 else np.float64)(1.0 / (1.0 - p))


def keep_scale(x: Tensor, p: float, seed: int) -> tuple[Tensor, Tensor]:
    """(x * (scale where kept, else 0), keep (bool, x's shape)) for contiguous float x and
    ``seed`` in [0, 2**64): the kernel, on torch's number of threads."""
    out = torch.empty_like(x)
    keep = torch.empty(x.shape, dtype=torch.bool)
    args = (_flat(x), _flat(out), _flat(keep), np.uint64(seed), np.uint64(threshold(p)))
    args += (_scale(p, x.dtype), CHUNK)
    runtime.launch(load_kernels().keep_scale, args, -(-x.numel() // CHUNK))
    return out, keep


def masked_scale(g: Tensor, keep: Tensor, p: float) -> Tensor:
    """g * (1 / (1 - p) where ``keep``, else 0) (dropout's backward); the kernel for a
    contiguous gradient of a served dtype outside a graph being recorded, torch ops otherwise
    (so a double backward sees them)."""
    if (
        torch.is_grad_enabled()
        or not g.is_contiguous()
        or g.dtype not in (torch.float32, torch.float64)
        or g.shape != keep.shape
        or type(g) is not Tensor
    ):
        return g * (keep.to(g.dtype) * float(_scale(p, g.dtype)))
    out = torch.empty_like(g)
    args = (_flat(g), _flat(out), _flat(keep), _scale(p, g.dtype), CHUNK)
    runtime.launch(load_kernels().masked_scale, args, -(-g.numel() // CHUNK))
    return out


class DropoutFunction(torch.autograd.Function):
    """Dropout of a served tensor x (any shape) -> x's shape; saves the bool keep mask."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        out, keep = keep_scale(x, p, draw_seed())
        ctx.save_for_backward(keep)
        ctx.p = p
        return out

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, None]:
        (keep,) = ctx.saved_tensors
        return masked_scale(g, keep, ctx.p), None


def dropout(x: Tensor, p: float) -> Tensor:
    """Training-mode dropout of x (any shape, kept): each element zeroed with probability ``p``,
    the others scaled by 1 / (1 - p) (module docstring); ``torch.nn.functional.dropout`` where
    the kernel does not serve (:func:`served`)."""
    if not served(x, p):
        return F.dropout(x, p, training=True)
    return DropoutFunction.apply(x, p)
