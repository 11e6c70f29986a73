"""The BlockMask built from attnkit's block maps (:mod:`attnkit.kernels.flex.block_classes`,
:mod:`attnkit.kernels.flex.block_mask`):

- the device-side block classes equal ``Mask.classes`` (attnkit's host implementation, itself
  tested against evaluated tiles) for every catalogue kind and combination, any block sizes,
  odd lengths, Lq != Lk;
- the BlockMask equals ``create_block_mask``'s on the same ``mask_mod`` (which evaluates every
  entry): the same partial and full block counts and index sets per query block;
- no host read-back (``.item()``, ``.tolist()``, ``bool(tensor)``, ``.cpu()``) while the classes
  of tensor-based masks are computed: a TorchFunctionMode spy records them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask

from attnkit import masks as M
from attnkit.kernels.flex.block_classes import block_classes
from attnkit.kernels.flex.block_mask import flex_classes, from_classes
from attnkit.kernels.flex.mods import FlexLayout, build_mods, supported_mask
from tests.support.host_sync import NoHostSync
from tests.support.masks import KINDS, make_case

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True, database=None)
CPU = torch.device("cpu")


LENGTHS, BLOCKS = st.integers(1, 70), st.integers(1, 9)
CASES = st.builds(
    dict,
    kind=st.sampled_from([k for k in KINDS if k != "none"]),
    batch=st.sampled_from([(), (3,), (2, 3)]),
    lq=LENGTHS, lk=LENGTHS, bq=BLOCKS, bk=BLOCKS,
    seed=st.integers(0, 2**20),
)  # fmt: skip


def _mask(c):
    spec = make_case(c["kind"], c["batch"], c["lq"], c["lk"], c["seed"])
    if spec is None:
        return None
    mask = M.normalize(spec.mask, c["batch"], c["lq"], c["lk"])
    return None if supported_mask(mask, len(c["batch"])) else mask


@SETTINGS
@given(c=CASES)
def test_device_classes_equal_the_mask_classes(c):
    mask = _mask(c)
    if mask is None:
        return
    lq, lk, bq, bk = c["lq"], c["lk"], c["bq"], c["bk"]
    got = block_classes(mask, lq, lk, bq, bk, FlexLayout(len(c["batch"])), CPU)
    want = mask.classes(lq, lk, bq, bk)
    got = got.expand(want.shape)
    assert got.dtype == torch.int8
    np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=str(c))


def _canonical(num: torch.Tensor, idx: torch.Tensor) -> list:
    """Per query block, the sorted set of the first ``num`` indices."""
    n, i = num.flatten(0, -2), idx.flatten(0, -3)
    return [
        [sorted(i[r, qb, : int(n[r, qb])].tolist()) for qb in range(n.shape[1])]
        for r in range(n.shape[0])
    ]


@SETTINGS
@given(c=CASES, bs=st.sampled_from([4, 8, 16]))
def test_block_mask_equals_create_block_mask(c, bs):
    mask = _mask(c)
    if mask is None:
        return
    batch, lq, lk = c["batch"], c["lq"], c["lk"]
    layout = FlexLayout(len(batch))
    mods = build_mods(mask, lq, lk, layout, CPU)
    bf, hf = ((1, 1) + tuple(batch))[-2:]
    nq, nk = -(-lq // bs), -(-lk // bs)
    classes = block_classes(mask, lq, lk, bs, bs, layout, CPU)
    classes = flex_classes(classes, mask.batch_shape, layout, nq, nk)
    ours = from_classes(classes.expand(bf, hf, -1, -1), lq, lk, mods.mask_mod, bs)
    mod = mods.mask_mod or (lambda b, h, q_idx, kv_idx: q_idx >= 0)
    theirs = create_block_mask(mod, bf, hf, lq, lk, device="cpu", BLOCK_SIZE=bs)
    assert _canonical(ours.kv_num_blocks, ours.kv_indices) == _canonical(
        theirs.kv_num_blocks, theirs.kv_indices
    ), c
    assert _canonical(ours.full_kv_num_blocks, ours.full_kv_indices) == _canonical(
        theirs.full_kv_num_blocks, theirs.full_kv_indices
    ), c


def test_tensor_masks_build_classes_without_host_reads():
    g = torch.Generator().manual_seed(0)
    ids = torch.sort(torch.randint(0, 5, (2, 300), generator=g), -1).values
    masks = [
        M.document(ids),
        M.document(ids) & M.causal(),
        M.key_padding([100, 250]) & M.sliding_window(16, 0),
        M.prefix_lm([3, 70]),
        M.from_key_padding_mask(torch.rand(2, 300, generator=g) < 0.3),
        M.TensorMask(torch.rand(2, 1, 300, 300, generator=g) < 0.5),
    ]
    for mask in masks:
        with NoHostSync():
            block_classes(mask, 300, 300, 64, 64, FlexLayout(2), CPU)


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("blocks", [(1, 1), (4, 4), (3, 7), (8, 5)])
def test_document_classes_by_sorted_search(sort, blocks):
    """Documents of various lengths, queries and keys with different ids, the sorted-search
    classes against Mask.classes (every block size, last blocks shorter)."""
    g = torch.Generator().manual_seed(7)
    bq, bk = blocks
    for lq, lk in ((8, 8), (29, 41), (64, 17)):
        ids = torch.randint(0, 4, (3, lq), generator=g)
        kv = torch.randint(0, 4, (3, lk), generator=g)
        if sort:
            ids, kv = ids.sort(-1).values, kv.sort(-1).values
        mask = M.document(ids, kv)
        got = block_classes(mask, lq, lk, bq, bk, FlexLayout(1), CPU)
        np.testing.assert_array_equal(got.numpy(), mask.classes(lq, lk, bq, bk).numpy())
