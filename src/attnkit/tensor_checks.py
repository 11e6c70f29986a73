"""Tensor, dtype and device checks shared by ``masks``, ``functional``, ``nn`` and ``models``.

The same conventions as :mod:`attnkit.checks` (its torch-free sibling): a value of the wrong
type raises ``TypeError``, a value of the right type that cannot be used raises ``ValueError``,
and every message starts with the argument's name, then what was expected and what was got.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.checks import show

__all__ = [
    "device",
    "float_dtype",
    "floating_tensor",
    "like",
    "tensor",
]


def tensor(name: str, x: object) -> Tensor:
    """``x`` if it is a torch.Tensor, else TypeError."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def floating_tensor(name: str, x: object) -> Tensor:
    """``x`` if it is a floating-point torch.Tensor, else TypeError."""
    t = tensor(name, x)
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    return t


def like(name: str, t: Tensor, ref: Tensor, ref_name: str) -> None:
    """``t`` must have ``ref``'s dtype (TypeError) and device (ValueError)."""
    if t.dtype != ref.dtype:
        raise TypeError(f"{name}: expected dtype {ref.dtype} like {ref_name}, got {t.dtype}")
    if t.device != ref.device:
        raise ValueError(f"{name}: expected device {ref.device} like {ref_name}, got {t.device}")


def float_dtype(name: str, x: object, allow_none: bool = True) -> torch.dtype | None:
    """``x`` if it is a floating-point torch.dtype (or None when allowed)."""
    if x is None and allow_none:
        return None
    if not isinstance(x, torch.dtype):
        raise TypeError(
            f"{name}: expected a floating-point torch.dtype"
            f"{' or None' if allow_none else ''}, got {show(x)} ({type(x).__name__})"
        )
    if not x.is_floating_point:
        raise ValueError(f"{name}: expected a floating-point torch.dtype, got {x}")
    return x


def device(name: str, x: object, allow_none: bool = True) -> torch.device | None:
    """``x`` as a torch.device (a str such as "cpu" is parsed); None when allowed.

    TypeError for other types; ValueError for a string torch cannot parse or a device this
    build of torch does not have (e.g. "cuda" without CUDA).
    """
    if x is None and allow_none:
        return None
    if isinstance(x, str):
        try:
            d = torch.device(x)
        except (RuntimeError, ValueError):
            raise ValueError(
                f"{name}: expected a device such as 'cpu' or 'cuda:0', got {show(x)}"
            ) from None
    elif isinstance(x, torch.device):
        d = x
    else:
        raise TypeError(
            f"{name}: expected a torch.device or str, got {show(x)} ({type(x).__name__})"
        )
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}: {show(x)} is not available (this torch has no CUDA device)")
    if d.type not in ("cpu", "cuda", "meta") and not hasattr(torch, d.type):
        raise ValueError(f"{name}: unsupported device type {d.type!r}")
    return d
