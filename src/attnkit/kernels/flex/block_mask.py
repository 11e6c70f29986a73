"""A FlexAttention ``BlockMask`` built from attnkit's exact block classes
(:mod:`.block_classes`) with ``BlockMask.from_kv_blocks``: PARTIAL blocks are listed in
``kv_num_blocks`` / ``kv_indices`` (Flex applies the ``mask_mod`` there), FULL blocks in
``full_kv_num_blocks`` / ``full_kv_indices`` (Flex skips the ``mask_mod``), EMPTY blocks
nowhere (skipped). Nothing evaluates the Lq x Lk grid, unlike ``create_block_mask``; all of
it runs on the call's device with no host round-trip.

Shape legend: ``Bf``, ``Hf`` the Flex batch and head dims of the block map (1 where the mask
does not vary); ``nq``, ``nk`` query and key blocks.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from attnkit.kernels.flex.mods import FlexLayout, MaskMod
from attnkit.masks.blocks import FULL, PARTIAL

__all__ = ["BLOCK_SIZE", "demote_tails", "flex_classes", "from_classes", "kv_lists"]

BLOCK_SIZE = 128
"""Flex's block size (queries and keys) used for the block map and the kernel."""


def flex_classes(
    classes: Tensor, batch_shape: tuple[int, ...], layout: FlexLayout, nq: int, nk: int
) -> Tensor:
    """A mask's classes (broadcastable to batch_shape + (nq, nk)) as Flex's (Bf, Hf, nq, nk):
    mask batch dim i becomes Flex dim ``layout.dims[i]``, dims of size 1 stay 1."""
    classes = classes.expand(batch_shape + (nq, nk))
    shape = [1, 1]
    for i, size in enumerate(batch_shape):
        shape["bh".index(layout.dims[i])] = size
    return classes.reshape(tuple(shape) + (nq, nk))


def kv_lists(sel: Tensor) -> tuple[Tensor, Tensor]:
    """(num (..., nq) int32, indices (..., nq, nk) int32): per query block, how many key blocks
    ``sel`` (bool (..., nq, nk)) selects and their indices first, in increasing order."""
    num = sel.sum(-1, dtype=torch.int32)
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
    return num, order.to(torch.int32)


def demote_tails(classes: Tensor, q_len: int, kv_len: int, block_size: int) -> Tensor:
    """``classes`` with FULL blocks in a last, shorter block row or column made PARTIAL."""
    tq, tk = q_len % block_size != 0, kv_len % block_size != 0
    if not (tq or tk):
        return classes
    tail = torch.zeros(classes.shape[-2:], dtype=torch.bool, device=classes.device)
    if tq:
        tail[-1, :] = True
    if tk:
        tail[:, -1] = True
    return torch.where(tail & (classes == FULL), torch.full_like(classes, PARTIAL), classes)


def from_classes(
    classes: Tensor, q_len: int, kv_len: int, mask_mod: MaskMod | None,
    block_size: int = BLOCK_SIZE,
) -> BlockMask:  # fmt: skip
    """The BlockMask of Flex classes (Bf, Hf, nq, nk) for lengths (Lq, Lk). A FULL block that
    reaches past Lq or Lk (the last, shorter one) is listed as partial, as
    ``create_block_mask`` does: Flex then masks its padding with the ``mask_mod``."""
    classes = demote_tails(classes, q_len, kv_len, block_size)
    kn, ki = kv_lists(classes == PARTIAL)
    fn, fi = kv_lists(classes == FULL)
    return BlockMask.from_kv_blocks(
        kn, ki, fn, fi, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(q_len, kv_len)
    )
