"""Padding masks built once per padding pattern (issue 32 section 3): the same lengths give the
same mask object (its caches reused across training steps), other lengths another object, and
every mask allows exactly the non-padding keys (checked against the ids by hand)."""

from __future__ import annotations

import torch

from attnkit.masks import KeyPadding
from attnkit.models import padding_masks as P

PAD = 0


def _ids(lengths: list[int], width: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 50, (len(lengths), width), generator=g)
    ids[torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]] = PAD
    return ids


def _want(ids: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, L, L) True = may attend, from the ids alone."""
    b, n = ids.shape
    ok = (ids != PAD)[:, None, :].expand(b, n, n)
    return ok & torch.ones(n, n, dtype=torch.bool).tril() if causal else ok


def test_same_lengths_share_one_mask_and_other_lengths_do_not():
    a, b = _ids([5, 3, 7], 7, seed=1), _ids([5, 3, 7], 7, seed=2)  # other tokens, same lengths
    c = _ids([5, 4, 7], 7, seed=1)
    assert P.padding_mask(a, PAD) is P.padding_mask(b, PAD)
    assert P.causal_padding_mask(a, PAD) is P.causal_padding_mask(b, PAD)
    assert P.padding_mask(c, PAD) is not P.padding_mask(a, PAD)
    assert P.causal_padding_mask(c, PAD) is not P.causal_padding_mask(a, PAD)
    assert isinstance(P.padding_mask(a, PAD), KeyPadding)
    for ids in (a, c):
        n = ids.shape[1]
        assert torch.equal(P.padding_mask(ids, PAD).materialize(n, n), _want(ids, False))
        assert torch.equal(P.causal_padding_mask(ids, PAD).materialize(n, n), _want(ids, True))


def test_padding_inside_a_row_keeps_the_per_position_mask():
    ids = _ids([6, 6], 6)
    ids[0, 2] = PAD  # not a suffix: the lengths cannot describe it
    m = P.padding_mask(ids, PAD)
    assert not isinstance(m, KeyPadding)
    assert torch.equal(m.materialize(6, 6), _want(ids, False))
    assert torch.equal(P.causal_padding_mask(ids, PAD).materialize(6, 6), _want(ids, True))


def test_rows_of_padding_only_and_the_memo_bound():
    ids = _ids([0, 2], 4)
    assert not P.padding_mask(ids, PAD).materialize(3, 4)[0].any()
    first = P.padding_mask(_ids([1], 3), PAD)
    for n in range(2, P.MEMO_SIZE + 3):  # more patterns than remembered: the first is dropped
        P.padding_mask(_ids([n], n), PAD)
    again = P.padding_mask(_ids([1], 3), PAD)
    assert again is not first and torch.equal(again.materialize(2, 3), first.materialize(2, 3))


def test_ids_on_an_accelerator_are_not_read_back():
    """Ids on a GPU (emulated: tests/support/fake_device.py) keep the per-position mask: the
    lengths would have to be read back to the host, which waits for the device."""
    from tests.support.fake_device import FakeCuda

    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 0, 0]])
    with FakeCuda() as fake:
        gpu_ids = ids.cuda()
        mask = P.padding_mask(gpu_ids, 0)
    assert not [r for r in fake.syncs if "padding_masks.py" in r.where], fake.syncs
    assert torch.equal(mask.materialize(4, 4), (ids != 0)[:, None, :].expand(2, 4, 4))
