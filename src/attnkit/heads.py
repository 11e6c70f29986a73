"""Multi-head plumbing, written once: split the feature dim into heads, merge them back, and
repeat grouped key/value heads for the query heads that share them.

Shape legend: ``B`` batch, ``L`` length, ``H`` query heads, ``G`` key/value heads (divides H),
``d`` head width. Re-exported by :mod:`attnkit.functional`.
"""

from __future__ import annotations

from torch import Tensor

from attnkit import checks
from attnkit import tensor_checks as tc
from attnkit.kernels.call.base import repeat_heads

__all__ = ["merge_heads", "repeat_kv_heads", "split_heads"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, L, num_heads * d) -> (B, num_heads, L, d), a view (no copy)."""
    x = tc.tensor("x", x)
    n = checks.positive_int("num_heads", num_heads)
    if x.dim() != 3 or x.shape[-1] % n:
        raise ValueError(
            f"x: expected shape (B, L, num_heads * d) with num_heads={n}, got {tuple(x.shape)}"
        )
    b, length, e = x.shape
    return x.reshape(b, length, n, e // n).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, L, d) -> (B, L, H * d), the inverse of :func:`split_heads`."""
    x = tc.tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"x: expected shape (B, H, L, d), got {tuple(x.shape)}")
    b, h, length, d = x.shape
    return x.transpose(1, 2).reshape(b, length, h * d)


def repeat_kv_heads(x: Tensor, num_heads: int) -> Tensor:
    """(..., G, L, d) -> (..., num_heads, L, d) for grouped-query attention: query head h uses
    key/value head h // (num_heads / G). A copy (as ``repeat_interleave``); ``x`` itself when
    G = num_heads. :func:`grouped_query_attention` avoids it where the backend allows."""
    x = tc.tensor("x", x)
    n = checks.positive_int("num_heads", num_heads)
    if x.dim() < 3 or n % x.shape[-3]:
        raise ValueError(
            f"x: expected shape (..., G, L, d) with G dividing num_heads={n}, got {tuple(x.shape)}"
        )
    return repeat_heads(x, n)
