"""The vocabulary every mask kind shares: block classes (EMPTY / PARTIAL / FULL), alignments,
the bounded LRU caches, and the block helpers (edges, classification of evaluated tiles),
below :mod:`attnkit.masks.base` and every mask kind (see :mod:`attnkit.masks` for the
conventions and the shape legend)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Literal

import torch
from torch import Tensor

from attnkit import checks

__all__ = [
    "ALIGNMENTS",
    "BLOCK_MAP_CACHE_SIZE",
    "EMPTY",
    "EVAL_ELEMENTS",
    "FULL",
    "PARTIAL",
    "PLAN_CACHE_SIZE",
    "Alignment",
    "LRUCache",
    "block_edges",
    "check_alignment",
    "check_sizes",
    "classify",
    "classify_tile",
    "common_batch",
    "lift_batch",
    "offset",
    "refine",
    "saturate",
]

EMPTY, PARTIAL, FULL = 0, 1, 2
"""Block classes returned by :meth:`Mask.block_map` (int8 values)."""

Alignment = Literal["top_left", "bottom_right"]
ALIGNMENTS = ("top_left", "bottom_right")

BLOCK_MAP_CACHE_SIZE = 16
"""Shapes whose block maps are kept per mask object (least recently used dropped first)."""

PLAN_CACHE_SIZE = 64
"""Kernel plans kept per mask object (least recently used dropped first)."""

EVAL_ELEMENTS = 2**22
"""Most mask entries evaluated at once when a block map needs exact evaluation."""


class LRUCache(OrderedDict):
    """A bounded, named least-recently-used cache (a dict that drops its oldest entries).

    ``get(key)`` and ``put(key, value)`` (or ``cache[key] = value``) mark the key as recently
    used; once more than ``maxsize`` entries are held, the least recently used is dropped.
    """

    def __init__(self, name: str = "cache", maxsize: int = 16) -> None:
        super().__init__()
        self.name = name
        self.maxsize = checks.positive_int("maxsize", maxsize)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value for ``key`` (now the most recently used), or ``default``."""
        try:
            self.move_to_end(key)
        except KeyError:
            return default
        return super().__getitem__(key)

    def put(self, key: Hashable, value: Any) -> Any:
        """Store ``value`` under ``key``, drop the oldest entries beyond ``maxsize``; ``value``."""
        self[key] = value
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)

    def __repr__(self) -> str:
        return f"LRUCache({self.name!r}, {len(self)}/{self.maxsize} entries)"


def check_alignment(alignment: object) -> str:
    """``alignment`` if it is "top_left" or "bottom_right" (TypeError / ValueError otherwise)."""
    return checks.choice("alignment", alignment, ALIGNMENTS)


def offset(alignment: str | None, q_len: int, kv_len: int) -> int:
    """Shift added to a query index so that it lines up with key indices (Lk - Lq when
    bottom-right aligned, else 0)."""
    return kv_len - q_len if alignment == "bottom_right" else 0


def block_edges(n: int, block: int) -> tuple[Tensor, Tensor]:
    """First and last index (inclusive) of every block of ``range(n)``: two (n_blocks,) tensors."""
    starts = torch.arange(0, n, block, device="cpu")
    ends = torch.clamp(starts + block, max=n) - 1
    return starts, ends


def classify(all_in: Tensor, any_in: Tensor) -> Tensor:
    """Block classes (int8) from 'every entry allowed' / 'some entry allowed' booleans."""
    all_in, any_in = torch.broadcast_tensors(all_in, any_in)
    out = torch.full(all_in.shape, PARTIAL, dtype=torch.int8, device="cpu")
    out[~any_in] = EMPTY
    out[all_in] = FULL
    return out


def classify_tile(t: Tensor, block_q: int, block_kv: int) -> Tensor:
    """Block classes of an evaluated tile ``(..., n, m)`` bool cut into blocks from its top-left
    corner (the last block in each direction may be shorter): int8 (..., ceil(n/bq), ceil(m/bk))."""
    n, m = t.shape[-2:]
    pq, pk = -n % block_q, -m % block_kv
    # padding must not change the classification: pad with True for 'all', False for 'any'
    all_in = torch.nn.functional.pad(t, (0, pk, 0, pq), value=True) if pq or pk else t
    any_in = torch.nn.functional.pad(t, (0, pk, 0, pq), value=False) if pq or pk else t
    shape = t.shape[:-2] + ((n + pq) // block_q, block_q, (m + pk) // block_kv, block_kv)
    all_b = all_in.reshape(shape).all(-1).all(-2)
    any_b = any_in.reshape(shape).any(-1).any(-2)
    return classify(all_b, any_b)


def check_sizes(q_len: object, kv_len: object) -> tuple[int, int]:
    """Both lengths as positive ints (TypeError / ValueError naming q_len or kv_len)."""
    return checks.positive_int("q_len", q_len), checks.positive_int("kv_len", kv_len)


def saturate(t: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``t`` cast to ``dtype`` with finite values clamped to +-finfo(dtype).max first, so a bias
    too large for ``dtype`` saturates instead of becoming +-inf (policy P5)."""
    if dtype is None:
        return t
    big = torch.finfo(dtype).max
    if t.dtype.is_floating_point and torch.finfo(t.dtype).max > big:
        t = torch.where(torch.isfinite(t), t.clamp(-big, big), t)
    return t.to(dtype)


# combinations (attnkit.masks.base.Intersection, Union)
def common_batch(a: Any, b: Any) -> tuple[int, ...]:
    """Left-aligned broadcast of two batch shapes."""
    n = max(len(a.batch_shape), len(b.batch_shape))
    sa = a.batch_shape + (1,) * (n - len(a.batch_shape))
    sb = b.batch_shape + (1,) * (n - len(b.batch_shape))
    out = []
    for x, y in zip(sa, sb, strict=True):
        if x != y and 1 not in (x, y):
            raise ValueError(
                f"mask: cannot combine masks with batch shapes {a.batch_shape} and {b.batch_shape}"
            )
        out.append(max(x, y))
    return tuple(out)


def lift_batch(x: Tensor, nb: int) -> Tensor:
    """Insert singleton dims after the batch dims of ``x`` (..., n, m) so it has ``nb`` of them."""
    have = x.dim() - 2
    if have >= nb:
        return x
    return x.reshape(x.shape[:-2] + (1,) * (nb - have) + x.shape[-2:])


def refine(mask: Any, bm: Tensor, ambiguous: Tensor, q_len, kv_len, block_q, block_kv) -> Tensor:
    """Replace the blocks flagged ``ambiguous`` in ``bm`` (both batch_shape + (nq, nk)) by their
    exact classes, evaluating ``mask`` (a :class:`~attnkit.masks.base.Mask`) only on the key
    span of each affected block row."""
    rows = ambiguous.reshape(-1, *ambiguous.shape[-2:]).any(0)  # (nq, nk)
    if not bool(rows.any()):
        return bm
    bm = bm.clone(memory_format=torch.contiguous_format)
    for qb in rows.any(1).nonzero().flatten().tolist():
        cols = rows[qb].nonzero().flatten()
        c0, c1 = int(cols[0]), int(cols[-1]) + 1
        q0, q1 = qb * block_q, min((qb + 1) * block_q, q_len)
        k0, k1 = c0 * block_kv, min(c1 * block_kv, kv_len)
        exact = classify_tile(mask.tile(q0, q1, k0, k1, q_len, kv_len), block_q, block_kv)
        sel = ambiguous[..., qb, c0:c1]
        bm[..., qb, c0:c1] = torch.where(sel, exact[..., 0, :], bm[..., qb, c0:c1])
    return bm
