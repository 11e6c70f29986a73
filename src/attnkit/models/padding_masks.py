"""Padding masks of token batches, built once per padding pattern.

A batch's padding mask is a new mask object at every training step, and a new object starts with
empty caches: dispatch then classifies its blocks again (which blocks are empty decides the
backend) and the kernels plan again. Here a batch whose padding is a suffix of every row (right
padding, as the batches of :mod:`attnkit.train` are) becomes ``key_padding(lengths)``, whose
block classes follow from the lengths without evaluating any tile, and batches with the same
lengths get the same mask object (a bounded LRU keyed by the lengths), so what its caches hold
is computed once per padding pattern. Padding elsewhere in a row keeps the per-position mask
(``from_key_padding_mask``).

Shape legend: ``B`` batch, ``L`` sequence length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.masks import LRUCache, Mask, causal, from_key_padding_mask, key_padding

__all__ = ["MEMO_SIZE", "causal_padding_mask", "padding_mask"]

MEMO_SIZE = 64
"""Padding patterns remembered (least recently used first out)."""

_MASKS = LRUCache("padding masks of token batches", maxsize=MEMO_SIZE)


def _lengths(ids: Tensor, pad_id: int) -> tuple[int, ...] | None:
    """The valid lengths of ids (B, L) when every row is tokens then only padding, else None
    (also for ids on an accelerator: reading the lengths back would wait for the device)."""
    if ids.device.type != "cpu":
        return None
    pad = ids == pad_id
    lengths = (~pad).sum(1)
    suffix = torch.arange(ids.shape[1], device=ids.device)[None, :] >= lengths[:, None]
    return tuple(lengths.tolist()) if torch.equal(pad, suffix) else None


def padding_mask(ids: Tensor, pad_id: int) -> Mask:
    """Keys of ids (B, L) that are not ``pad_id`` (batch_shape (B,)): one shared
    ``key_padding(lengths)`` per lengths when the padding is a suffix (module docstring)."""
    lengths = _lengths(ids, pad_id)
    if lengths is None:
        return from_key_padding_mask(ids == pad_id)
    return lengths_mask(lengths)


def lengths_mask(lengths: tuple[int, ...]) -> Mask:
    """``key_padding(lengths)``, the same object for the same lengths while remembered."""
    key = ("keys", lengths)
    mask = _MASKS.get(key)
    return mask if mask is not None else _MASKS.put(key, key_padding(list(lengths)))


def causal_padding_mask(ids: Tensor, pad_id: int) -> Mask:
    """``causal() & padding_mask(ids, pad_id)``, the same object for the same lengths while
    remembered (a decoder's self-attention mask over targets ids (B, L))."""
    lengths = _lengths(ids, pad_id)
    if lengths is None:
        return causal() & from_key_padding_mask(ids == pad_id)
    key = ("causal", lengths)
    mask = _MASKS.get(key)
    return mask if mask is not None else _MASKS.put(key, causal() & lengths_mask(lengths))
