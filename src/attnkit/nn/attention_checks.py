"""The argument and result checks of :class:`~attnkit.nn.attention.MultiHeadAttention`: inputs
against the module's widths and parameters, masks against (B, H, Lq, Lk) (remembered per module
for a repeated mask), and what its ``attention_fn`` returns.

Shape legend as in :mod:`attnkit.nn.attention`.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from attnkit import functional, tensor_checks, tensor_version

__all__ = ["check_input", "check_mask_dims", "check_mask_sizes", "check_result"]

# module -> (mask key, weak reference to the mask) of its last checked mask (kept out of the
# module itself so that modules stay picklable)
_CHECKED_MASK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_input(
    name: str, x: object, width: int, width_name: str, like: Tensor, batch_first: bool
) -> Tensor:
    """``x`` (B, L, width) ((L, B, width) unless ``batch_first``), of ``like``'s dtype and
    device, non-empty, returned batch first; TypeError / ValueError naming ``name``."""
    layout = "(B, L, E)" if batch_first else "(L, B, E)"
    x = tensor_checks.tensor(name, x)
    if x.dim() != 3:
        raise ValueError(f"{name}: expected 3 dims {layout}, got shape {tuple(x.shape)}")
    if x.shape[-1] != width:
        raise ValueError(
            f"{name}: expected last dim {width_name}={width}, got shape {tuple(x.shape)}"
        )
    if x.dtype != like.dtype:
        raise TypeError(f"{name}: expected dtype {like.dtype} like the parameters, got {x.dtype}")
    if x.device != like.device:
        raise ValueError(
            f"{name}: expected device {like.device} like the parameters, got {x.device}"
        )
    if 0 in x.shape:
        raise ValueError(f"{name}: expected non-empty dims, got shape {tuple(x.shape)}")
    return x if batch_first else x.transpose(0, 1)


def check_mask_dims(mask: object) -> None:
    """Refuse a 3-D mask tensor (ambiguous against (B, H, Lq, Lk))."""
    if isinstance(mask, Tensor) and mask.dim() == 3:
        raise ValueError(
            f"mask: a 3-D tensor {tuple(mask.shape)} is ambiguous against (B, H, Lq, Lk); "
            "give (Lq, Lk), (B, 1, Lq, Lk), or a per-batch mask as "
            "attnkit.masks.from_tensor(mask) (leading dim = B)"
        )


def check_mask_sizes(
    module: nn.Module, mask: object, bh: tuple[int, int], lq: int, lk: int, device: torch.device
) -> None:
    """``functional.check_mask`` against (B, H, Lq, Lk) (``bh`` = (B, H)); skipped when
    ``module``'s previous call checked the same mask object (same tensor version) at the same
    sizes."""
    if mask is None:
        return
    counter = tensor_version.version(mask) if isinstance(mask, Tensor) else -1
    version = False if counter is None else counter  # inference tensor: check every time
    key = (id(mask), version, *bh, lq, lk, device)
    last = _CHECKED_MASK.get(module)
    if last is not None and last[0] == key and last[1]() is mask:
        return
    functional.check_mask(mask, bh, lq, lk, device)
    if version is not False:
        try:
            _CHECKED_MASK[module] = (key, weakref.ref(mask))
        except TypeError:  # not weak-referenceable: check every time
            pass


def check_result(
    res: object, shape: tuple[int, int, int, int], lk: int, return_weights: bool
) -> tuple[Tensor, Tensor | None]:
    """attention_fn's (out (B, H, Lq, d) = ``shape``, weights (B, H, Lq, Lk) or None), or
    ValueError."""
    b, h, lq, _ = shape
    out, weights = res if isinstance(res, tuple) and len(res) == 2 else (None, None)
    if not isinstance(out, Tensor) or out.shape != shape:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(res).__name__
        raise ValueError(
            f"attention_fn: expected to return (out, weights) with out of shape "
            f"(B, H, Lq, d) = {shape}, got {got}"
        )
    if return_weights and (not isinstance(weights, Tensor) or weights.shape != (b, h, lq, lk)):
        got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(
            f"attention_fn: expected weights of shape (B, H, Lq, Lk) = {(b, h, lq, lk)} "
            f"with return_weights=True, got {got}"
        )
    return out, weights if return_weights else None
